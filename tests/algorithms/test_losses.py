import math

import pytest
import torch

from mutual_rl.algorithms import policy_loss

# Hand example. Row 0: Â = +2, ratios 1.5 (clipped high at 1.28), 0.7, 1.1 (both unclipped).
# Row 1: Â = -1, ratios 0.5 (clipped low at 0.8), 1.4 (unclipped), pad (ratio 3.0, masked out).
# Token losses ℓ = −min(ρÂ, clip(ρ)Â):
#   row 0: −2·1.28 = −2.56, −2·0.7 = −1.4, −2·1.1 = −2.2           (sum −6.16)
#   row 1: +0.8, +1.4, (masked)                                    (sum  2.2)
RATIOS = [[1.5, 0.7, 1.1], [0.5, 1.4, 3.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
ADV = [2.0, -1.0]


def _inputs(requires_grad=False):
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.5]], dtype=torch.float64)
    logp = (old + torch.tensor(RATIOS, dtype=torch.float64).log()).requires_grad_(requires_grad)
    return logp, old, torch.tensor(ADV, dtype=torch.float64), torch.tensor(MASK, dtype=torch.float64)


@pytest.mark.parametrize(
    "agg, expected",
    [
        ("token-mean", (-6.16 + 2.2) / 5),  # -0.792
        ("seq-mean-token-mean", (-6.16 / 3 + 2.2 / 2) / 2),  # -0.4766667
        ("seq-mean-token-sum-norm", (-6.16 / 4 + 2.2 / 4) / 2),  # -0.495 (max_len 4)
    ],
)
def test_hand_example_modes(agg, expected):
    logp, old, adv, mask = _inputs()
    loss, metrics = policy_loss(logp, old, adv, mask, agg=agg, max_len=4)
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert metrics["pg_loss"].item() == pytest.approx(expected, abs=1e-12)
    assert metrics["clip_frac_low"].item() == pytest.approx(0.2)
    assert metrics["clip_frac_high"].item() == pytest.approx(0.2)
    assert metrics["clip_frac_dual"].item() == 0.0
    assert metrics["ratio_mean"].item() == pytest.approx(5.2 / 5)
    k3 = sum(r - 1 - math.log(r) for r in [1.5, 0.7, 1.1, 0.5, 1.4]) / 5
    assert metrics["approx_kl"].item() == pytest.approx(k3, abs=1e-12)
    assert metrics["num_tokens"].item() == 5
    assert all(not v.requires_grad and v.dim() == 0 for v in metrics.values())


def test_hand_example_gradient():
    logp, old, adv, mask = _inputs(requires_grad=True)
    loss, _ = policy_loss(logp, old, adv, mask)
    loss.backward()
    # d(−Âρ)/dlogp = −Âρ on unclipped tokens, 0 on clipped and masked ones; / 5 tokens.
    expected = torch.tensor([[0.0, -2 * 0.7, -2 * 1.1], [0.0, 1.4, 0.0]], dtype=torch.float64) / 5
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-12)


def test_weights():
    logp, old, adv, mask = _inputs()
    w = torch.tensor([0.5, 2.0], dtype=torch.float64)
    loss, _ = policy_loss(logp, old, adv, mask, weights=w)
    assert loss.item() == pytest.approx((0.5 * -6.16 + 2 * 2.2) / 5, abs=1e-12)  # 0.264
    loss, _ = policy_loss(logp, old, adv, mask, weights=w, agg="seq-mean-token-mean")
    assert loss.item() == pytest.approx((0.5 * -6.16 / 3 + 2 * 2.2 / 2) / 2, abs=1e-12)


def test_dual_clip():
    # Â = −1 everywhere; ratios 4.0 (dual-clipped at c=3 -> ℓ=3), 2.0 (ℓ=2), 0.5 (clipped low: ℓ=0.8).
    old = torch.zeros(1, 3, dtype=torch.float64)
    logp = torch.tensor([[4.0, 2.0, 0.5]], dtype=torch.float64).log().requires_grad_(True)
    adv, mask = torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64)
    loss, m = policy_loss(logp, old, adv, mask, dual_clip=3.0)
    assert loss.item() == pytest.approx((3.0 + 2.0 + 0.8) / 3, abs=1e-12)
    assert m["clip_frac_dual"].item() == pytest.approx(1 / 3)
    assert m["clip_frac_low"].item() == pytest.approx(1 / 3) and m["clip_frac_high"].item() == 0.0
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 2.0 / 3, 0.0]], dtype=torch.float64))
    no_dual, _ = policy_loss(logp, old, adv, mask)
    assert no_dual.item() == pytest.approx((4.0 + 2.0 + 0.8) / 3, abs=1e-12)
    # Dual clip never touches positive advantages.
    pos, _ = policy_loss(logp, old, -adv, mask, dual_clip=3.0)
    assert pos.item() == pytest.approx(-(1.28 + 1.28 + 0.5) / 3, abs=1e-12)


def test_kl_term():
    logp, old, adv, mask = _inputs()
    ref = logp.detach() - 0.5  # d = logp − ref = 0.5 everywhere -> k3 = e^-0.5 + 0.5 − 1
    k3 = math.exp(-0.5) - 0.5
    loss, m = policy_loss(logp, old, adv, mask, ref_logp=ref, kl_coef=0.1)
    assert loss.item() == pytest.approx(-0.792 + 0.1 * k3, abs=1e-12)
    assert m["pg_loss"].item() == pytest.approx(-0.792, abs=1e-12)
    assert m["kl"].item() == pytest.approx(k3, abs=1e-12) and m["kl_loss"].item() == pytest.approx(k3)
    loss, m = policy_loss(logp, old, adv, mask, ref_logp=ref, kl_coef=0.1, kl_kind="k2")
    assert loss.item() == pytest.approx(-0.792 + 0.1 * 0.125, abs=1e-12)
    off, m = policy_loss(logp, old, adv, mask, ref_logp=ref)  # β = 0: KL reported, not added
    assert off.item() == pytest.approx(-0.792, abs=1e-12) and "kl" in m


def test_errors():
    logp, old, adv, mask = _inputs()
    with pytest.raises(ValueError, match="choices.*seq-mean-token-mean.*token-mean"):
        policy_loss(logp, old, adv, mask, agg="sum")
    with pytest.raises(ValueError, match="max_len"):
        policy_loss(logp, old, adv, mask, agg="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(logp, old, adv, mask, dual_clip=1.0)
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(logp, old, adv, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="choices"):
        policy_loss(logp, old, adv, mask, ref_logp=old, kl_kind="k4")
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, old, adv[:1], mask)
