"""The simulated device of tests/device_check.py: it raises where CUDA would, and only there."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.device_check import DEVICE, HOST, SIM, SimulatedDevice, place, simulated_device, tag_of

MIXED = "Expected all tensors to be on the same device"


def test_sim_is_a_distinct_device():
    assert SIM != torch.device("cpu") and SIM.type == "cpu" and SIM.index == 0


def test_mixing_a_host_tensor_with_a_device_tensor_raises():
    with SimulatedDevice():
        x = torch.ones(3, device=SIM)
        with pytest.raises(RuntimeError, match=MIXED) as err:
            x + torch.ones(3)
        assert "(3,) float32" in str(err.value)
        with pytest.raises(RuntimeError, match=MIXED):
            torch.cat([x, torch.zeros(2)])
        with pytest.raises(RuntimeError, match=MIXED):  # a device 0-dim tensor with a host vector: CUDA raises too
            torch.ones(2) * x.sum()


def test_a_host_scalar_with_a_device_tensor_is_allowed():
    with SimulatedDevice():
        y = torch.ones(3, device=SIM) * torch.tensor(2.0)
        assert tag_of(y) == DEVICE and y.device == SIM
    assert y.tolist() == [2.0, 2.0, 2.0]  # real values


def test_factories_follow_the_device_they_name():
    with SimulatedDevice():
        x = torch.zeros(2, device=SIM)
        made = [torch.arange(3, device=x.device), torch.full((2,), 7, device=x.device), torch.zeros_like(x),
                x.new_ones(2), torch.tensor([1, 2], device=torch.device(x.device))]
        assert all(tag_of(t) == DEVICE and t.device == SIM for t in made)
        host = [torch.arange(3), torch.tensor([1, 2]), torch.as_tensor([1.0]), torch.zeros(2, device="cpu"),
                torch.zeros_like(x, device=torch.device("cpu"))]
        assert all(tag_of(t) == HOST and t.device == torch.device("cpu") for t in host)
        moved = torch.as_tensor(host[0], device=x.device)  # no copy in real torch, yet a device tensor here
        assert tag_of(moved) == DEVICE and tag_of(host[0]) == HOST
        assert torch.from_numpy(torch.ones(2).numpy()).device == torch.device("cpu")
        assert tag_of(torch.from_numpy(torch.ones(2).numpy())) == HOST


def test_to_the_policy_device_fixes_a_host_tensor():
    torch.manual_seed(0)
    lin = nn.Linear(2, 3)
    expected = lin(torch.tensor([[1.0, -2.0]])).detach()
    with simulated_device(lin):
        h = torch.tensor([[1.0, -2.0]])  # made inside the mode: a host tensor (made outside: untagged, unknown)
        device = next(lin.parameters()).device
        assert device == SIM
        with pytest.raises(RuntimeError, match=MIXED):
            lin(h)
        out = lin(h.to(device))
        assert tag_of(out) == DEVICE
    assert torch.equal(out.detach(), expected)


def test_cpu_moves_a_copy_to_the_host():
    with SimulatedDevice():
        x = torch.ones(3, device=SIM)
        back = x.cpu()
        assert tag_of(back) == HOST and tag_of(x) == DEVICE and back.device == torch.device("cpu")
        with pytest.raises(RuntimeError, match=MIXED):
            x + back
        assert tag_of(x.to("cpu")) == HOST and tag_of(back.to(x)) == DEVICE and tag_of(back.to(SIM)) == DEVICE
        assert tag_of(x.float()) == DEVICE  # a dtype change stays on the device


def test_indexing_a_device_tensor_with_host_indices_is_allowed():
    with SimulatedDevice():
        x = torch.arange(4.0, device=SIM)
        picked = x[torch.tensor([0, 2])]
        assert tag_of(picked) == DEVICE and picked.tolist() == [0.0, 2.0]
        assert x[torch.tensor([True, False, True, False])].tolist() == [0.0, 2.0]
        x[torch.tensor([1])] = torch.tensor(9.0)  # index_put_ moves a 0-dim value
        x[2:] = torch.tensor([5.0, 6.0])  # basic indexing: a copy, from anywhere
        assert tag_of(x) == DEVICE and x.tolist() == [0.0, 9.0, 5.0, 6.0]
        with pytest.raises(RuntimeError, match=MIXED):  # index_put_ with a host vector: CUDA raises
            x[[0, 1]] = torch.tensor([7.0, 8.0])
        with pytest.raises(RuntimeError, match=MIXED):  # and a device vector into a host tensor too
            torch.zeros(4)[torch.tensor([0, 1])] = x[:2]
        with pytest.raises(RuntimeError, match=MIXED):  # a device index into a host tensor: CUDA raises
            torch.arange(4.0)[torch.tensor([0], device=SIM)]
        with pytest.raises(RuntimeError, match=MIXED):  # an op that is not indexing does not get the exemption
            x.index_select(0, torch.tensor([0, 1]))


def test_module_to_sim_places_parameters_and_buffers():
    bn = nn.BatchNorm1d(2)
    with SimulatedDevice():
        bn.to(SIM)
        assert all(t.device == SIM for t in [*bn.parameters(), *bn.buffers()])
        bn(torch.ones(2, 2, device=SIM))  # the buffers' running statistics update on the device


def test_a_placed_linear_trains_without_a_false_alarm():
    torch.manual_seed(0)
    lin = nn.Linear(4, 2)
    ref = nn.Linear(4, 2)
    ref.load_state_dict(lin.state_dict())
    x, y = torch.randn(8, 4), torch.randn(8, 2)  # untagged here; .to(dev) below makes device copies

    def step(model, x, y):
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(loss.detach()), float(norm)

    expected = step(ref, x, y)
    with simulated_device(lin):
        dev = next(lin.parameters()).device
        got = step(lin, x.to(dev), y.to(dev))
        assert all(tag_of(p) == DEVICE for p in lin.parameters())
    assert got == expected
    assert all(torch.equal(a, b) for a, b in zip(lin.parameters(), ref.parameters()))
    assert not torch.equal(lin.weight, ref.weight.new_zeros(2, 4))


def test_place_tags_a_kl_reference_copy():
    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = nn.Linear(2, 2)
            self._reference = [nn.Linear(2, 2)]  # a list: not a submodule, as Policy's

    holder = place(Holder())
    assert all(tag_of(p) == DEVICE for p in holder._reference[0].parameters())
