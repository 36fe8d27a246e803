"""Chunked log-probs from hidden states equal the plain log-softmax of full logits: values, entropies and the
gradients of hidden states, weight and bias, for every chunking (one row per chunk up to one chunk in all)."""

from __future__ import annotations

import pytest
import torch

from mutual_rl.algorithms.token_logp import token_logp_from_hidden


def _plain(hidden, weight, bias, targets, temperature):
    logits = hidden @ weight.t() + (0 if bias is None else bias)
    z = logits.float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    return logp, entropy


@pytest.mark.parametrize("chunk_elements", [1, 3 * 11, 10 ** 9])  # 1 row per chunk, 3 rows, everything at once
@pytest.mark.parametrize("with_bias", [False, True])
def test_chunked_equals_full_logits_with_gradients(chunk_elements, with_bias):
    g = torch.Generator().manual_seed(0)
    B, T, H, V, tau = 2, 5, 7, 11, 0.7
    hidden = torch.randn(B, T, H, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True) if with_bias else None
    targets = torch.randint(0, V, (B, T), generator=g)
    upstream = torch.randn(B, T, generator=g, dtype=torch.float64)

    ref_logp, ref_ent = _plain(hidden, weight, bias, targets, tau)
    ref_grads = torch.autograd.grad((ref_logp * upstream).sum(), [hidden, weight] + ([bias] if with_bias else []))
    logp, ent = token_logp_from_hidden(hidden, weight, bias, targets, tau, with_entropy=True,
                                       max_chunk_elements=chunk_elements)
    grads = torch.autograd.grad((logp * upstream).sum(), [hidden, weight] + ([bias] if with_bias else []))
    # float32 logits by design (as the policy's plain path): agreement to float32 rounding
    torch.testing.assert_close(logp.double(), ref_logp.double(), rtol=0, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent.double(), rtol=0, atol=1e-5)
    assert not ent.requires_grad and logp.shape == (B, T)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-5, atol=1e-5)


def test_hand_derived_values():
    """One token, H = 1, W = [[1], [2]] (z = [h, 2h] / τ): logp(y=1) = 2h/τ - log(e^{h/τ} + e^{2h/τ})."""
    h = torch.tensor([[0.5]], requires_grad=True)
    w = torch.tensor([[1.0], [2.0]])
    logp, _ = token_logp_from_hidden(h, w, None, torch.tensor([1]), 0.5)
    z = torch.tensor([1.0, 2.0])
    assert logp.item() == pytest.approx((2.0 - torch.logsumexp(z, 0)).item(), abs=1e-6)
    logp.sum().backward()
    p = torch.softmax(z, 0)  # d logp / d h = Σ_v (onehot_v - p_v) W_v / τ = (2 - (p0 + 2 p1)) / 0.5
    assert h.grad.item() == pytest.approx(((2.0 - (p[0] + 2 * p[1])) / 0.5).item(), abs=1e-6)


def test_frozen_weight_gets_no_gradient_and_bad_chunk_is_named():
    h = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(6, 4)
    logp, ent = token_logp_from_hidden(h, w, None, torch.tensor([0, 5, 2]), 1.0)
    logp.sum().backward()
    assert ent is None and h.grad is not None and w.grad is None
    with pytest.raises(ValueError, match="max_chunk_elements must be >= 1"):
        token_logp_from_hidden(h, w, None, torch.tensor([0, 5, 2]), 1.0, max_chunk_elements=0)
