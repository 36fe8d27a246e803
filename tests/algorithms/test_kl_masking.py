import math

import pytest
import torch

from mutual_rl.algorithms import KL_ESTIMATORS, kl_penalty, masked_mean, masked_sum, token_entropy


def test_kl_hand_values():
    logp = torch.tensor([[-1.0, -2.0, -0.7]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0, -0.7]], dtype=torch.float64)  # d = logp − ref = 0.5, −1, 0
    torch.testing.assert_close(
        kl_penalty(logp, ref, "k1"), torch.tensor([[0.5, -1.0, 0.0]], dtype=torch.float64)
    )
    torch.testing.assert_close(
        kl_penalty(logp, ref, "k2"), torch.tensor([[0.125, 0.5, 0.0]], dtype=torch.float64)
    )
    k3 = torch.tensor(
        [[math.exp(-0.5) + 0.5 - 1, math.e - 2, 0.0]], dtype=torch.float64
    )  # 0.1065307, 0.7182818
    torch.testing.assert_close(kl_penalty(logp, ref), k3, rtol=0, atol=1e-12)


def test_k3_nonnegative_and_registry():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 32, generator=gen) * 3, torch.randn(64, 32, generator=gen) * 3
    assert (kl_penalty(a, b, "k3") >= 0).all() and (kl_penalty(a, b, "k2") >= 0).all()
    assert sorted(KL_ESTIMATORS) == ["k1", "k2", "k3"]
    with pytest.raises(ValueError, match=r"choices: \['k1', 'k2', 'k3'\]"):
        kl_penalty(a, b, "mse")


def test_masked_reductions():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert masked_sum(x, m).item() == 3.0 and masked_mean(x, m).item() == 1.5
    torch.testing.assert_close(masked_mean(x, m, dim=-1), torch.tensor([1.5, 0.0]))
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0


def test_token_entropy():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [1000.0, 0.0, -1000.0, 0.0]]], dtype=torch.float64)
    h = token_entropy(logits)
    assert h.shape == (1, 2)
    assert h[0, 0].item() == pytest.approx(math.log(4)) and h[0, 1].item() == pytest.approx(0.0, abs=1e-12)
    z = torch.randn(3, 5, 7, dtype=torch.float64)
    p = torch.softmax(z, -1)
    torch.testing.assert_close(token_entropy(z), -(p * p.log()).sum(-1))
