"""Micro-batch invariance and zero-advantage skipping, on a tiny linear "model" in float64."""

import pytest
import torch

from mutual_rl.algorithms import AGGREGATIONS, aggregate, policy_loss, zero_advantage_skip_mask

B, T, H, V, MAX_LEN = 8, 6, 5, 11, 6


def _batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    feats = torch.randn(B, T, H, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, V, (B, T), generator=gen)
    lengths = torch.tensor([6, 1, 3, 5, 2, 6, 4, 3])
    mask = (torch.arange(T) < lengths[:, None]).double()
    adv = torch.randn(B, generator=gen, dtype=torch.float64)
    adv[[1, 4, 6]] = 0.0  # zero-advantage rows (all-fail / all-pass groups)
    weights = torch.rand(B, generator=gen, dtype=torch.float64) + 0.5
    w0 = torch.randn(H, V, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        old_logp = _logp(w0, feats, tokens) + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    return feats, tokens, mask, adv, weights, w0, old_logp


def _logp(w, feats, tokens):
    return torch.log_softmax(feats @ w, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _grad(w0, feats, tokens, old_logp, adv, mask, weights, agg, chunks, token_count=None, num_seqs=None):
    w = w0.clone().requires_grad_(True)
    total = torch.zeros((), dtype=torch.float64)
    for rows in chunks:
        loss, _ = policy_loss(
            _logp(w, feats[rows], tokens[rows]), old_logp[rows], adv[rows], mask[rows],
            agg=agg, weights=weights[rows], dual_clip=3.0, max_len=MAX_LEN,
            token_count=token_count, num_seqs=num_seqs,
        )  # fmt: skip
        total = total + loss
    total.backward()
    return total.detach(), w.grad


@pytest.mark.parametrize("agg", sorted(AGGREGATIONS))
def test_microbatch_gradient_invariance(agg):
    feats, tokens, mask, adv, weights, w0, old = _batch()
    full_loss, full_grad = _grad(w0, feats, tokens, old, adv, mask, weights, agg, [torch.arange(B)])
    assert full_grad.abs().sum() > 0
    chunks = [torch.tensor([0, 1, 2]), torch.tensor([3]), torch.tensor([4, 5, 6, 7])]
    mb_loss, mb_grad = _grad(
        w0, feats, tokens, old, adv, mask, weights, agg, chunks, token_count=mask.sum(), num_seqs=B
    )
    torch.testing.assert_close(mb_loss, full_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(mb_grad, full_grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("agg", sorted(AGGREGATIONS))
def test_zero_advantage_skip_same_gradient(agg):
    feats, tokens, mask, adv, weights, w0, old = _batch(1)
    full_loss, full_grad = _grad(w0, feats, tokens, old, adv, mask, weights, agg, [torch.arange(B)])
    skip = zero_advantage_skip_mask(adv)
    assert skip.tolist() == [False, True, False, False, True, False, True, False]
    kept = torch.nonzero(~skip).squeeze(-1)
    loss, grad = _grad(
        w0,
        feats,
        tokens,
        old,
        adv,
        mask,
        weights,
        agg,
        [kept[:2], kept[2:]],
        token_count=mask.sum(),
        num_seqs=B,
    )
    torch.testing.assert_close(loss, full_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, full_grad, rtol=1e-6, atol=1e-6)


def test_skip_mask_disabled_by_other_terms():
    adv = torch.tensor([0.0, 1.0, 0.0])
    assert zero_advantage_skip_mask(adv).tolist() == [True, False, True]
    assert not zero_advantage_skip_mask(adv, kl_coef=1e-3).any()
    assert not zero_advantage_skip_mask(adv, extra_loss=True).any()


def test_aggregate_direct_and_errors():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # third row has no response tokens
    assert aggregate(loss, mask).item() == pytest.approx(7 / 3)
    assert aggregate(loss, mask, token_count=7).item() == pytest.approx(1.0)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((1.5 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-mean", num_seqs=4).item() == pytest.approx(5.5 / 4)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", max_len=10).item() == pytest.approx(
        (0.3 + 0.4) / 2
    )
    assert aggregate(loss, torch.zeros_like(mask)).item() == 0.0
    with pytest.raises(ValueError, match=r"choices: \['seq-mean-token-mean', 'seq-mean-token-sum-norm'"):
        aggregate(loss, mask, "mean")
    with pytest.raises(ValueError, match="max_len"):
        aggregate(loss, mask, "seq-mean-token-sum-norm")
