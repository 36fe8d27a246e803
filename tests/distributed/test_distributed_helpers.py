"""The multi-process helpers without a process group (one process): identities, the rank split, the compute
device."""

from __future__ import annotations

import pytest

from mutual_rl import distributed as D


def test_one_process_helpers_are_identities():
    assert D.rank_and_world() == (0, 1) and not D.is_distributed()
    assert D.agree_max([3, 0, 2]) == [3, 0, 2] and D.agree_sum([1.5, 2]) == [1.5, 2.0]
    assert D.gather_objects({"x": 1}) == [{"x": 1}]
    assert str(D.collective_device()) == "cpu" and not D.lockstep_needed(None)


@pytest.mark.parametrize("n, world", [(10, 3), (2, 4), (0, 2), (7, 1)])
def test_rank_part_splits_in_order_without_overlap(n, world):
    items = list(range(n))
    parts = [D.rank_part(items, r, world) for r in range(world)]
    assert sum(parts, []) == items
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_destroy_process_group_ends_a_live_group_and_is_idempotent(tmp_path):
    import torch.distributed as dist

    D.destroy_process_group()  # none yet: a no-op
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    assert dist.is_initialized()
    D.destroy_process_group()
    assert not dist.is_initialized()
    D.destroy_process_group()


def test_compute_device_is_the_fsdp_units_not_the_parameters(tmp_path):
    """A policy's forwards compute on its FSDP unit's compute device, also when the parameters wait elsewhere
    between forwards (cpu_offload: on the CPU while the unit computes on a GPU)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel

    lin = torch.nn.Linear(2, 2)
    assert D.compute_device(lin) == torch.device("cpu")  # no FSDP: the parameters' device
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        unit = FullyShardedDataParallel(lin, device_id=torch.device("cpu"), use_orig_params=True)
        assert D.compute_device(torch.nn.Sequential(unit)) == unit.compute_device == torch.device("cpu")
        unit.compute_device = torch.device("cuda", 1)  # as with cpu_offload on GPU 1
        assert D.compute_device(unit) == torch.device("cuda", 1) and next(unit.parameters()).device.type == "cpu"
    finally:
        D.destroy_process_group()


def test_the_fsdp_strategy_destroys_its_group_at_exit(monkeypatch):
    """The strategy registers the destruction once at exit, however many times its environment is set up."""
    import atexit

    from lightning.pytorch.strategies import FSDPStrategy

    from mutual_rl.strategies import MutualFSDPStrategy

    registered = []
    monkeypatch.setattr(FSDPStrategy, "setup_environment", lambda self: None)
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(atexit, "unregister", lambda f: registered.remove(f) if f in registered else None)
    strategy = MutualFSDPStrategy()
    strategy.setup_environment()
    strategy.setup_environment()
    assert registered == [D.destroy_process_group]
