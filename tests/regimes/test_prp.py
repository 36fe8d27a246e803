"""PRP: pooled batch (THL-crossed peers), pooled advantages, both denominators under both objective forms (clip,
the default, and tis: the PRPTruncatedIS objective)."""

from __future__ import annotations

import math

import pytest
import torch

from mutual_rl.regimes import get_regime
from mutual_rl.regimes.base import split_rows
from mutual_rl.stats import flatten
from mutual_rl.step.scoring import plan_regime
from mutual_rl.types import PolicyBatch
from mutual_rl.update.config import GRPOConfig
from mutual_rl.update.objectives import Norms, PRPTruncatedIS, resolve
from tests.regimes.helpers_xsp import assert_flows, assert_partition
from tests.regimes.scenario import FakeReceiver, make_group

EPS = 1e-6


def char_ids(recv, text):
    return recv.tokenizer(text, add_special_tokens=False)["input_ids"] + [recv.tokenizer.eos_token_id]


def row_ids(batch, row):
    return batch.input_ids[row, -batch.response_width:][batch.response_mask[row].bool()].tolist()


def scenario():
    recv = FakeReceiver("r")
    own = [make_group("r", 0, [0, 0])]
    # S answers "12 34" (bpe: '1','2',' ','3','4',EOS) with a scripted trace, and "47"
    peers = {"s": [make_group("s", 0, [1, 0], kind="bpe", texts=["12 34", "47"],
                              logps=[[-0.1, -0.3, -0.2, -0.4, -0.6, -0.8], [-1.0, -2.0, -3.0]])]}
    return recv, own, peers


def test_learner_snapshot_pooled_advantages_and_rows():
    # pool [0,0,1,0]: mean 0.25, Σ dev^2 = 3·0.0625 + 0.5625 = 0.75, var 0.25, std 0.5
    # Â = (r - 0.25) / 0.500001 = [-0.25, -0.25, 0.75, -0.25] / 0.500001 ≈ [-0.5, -0.5, 1.5, -0.5]
    recv, own, peers = scenario()
    plan = plan_regime(get_regime("prp"), recv, own, peers, 1)
    b = plan.batch
    torch.testing.assert_close(b.advantages, torch.tensor([-0.25, -0.25, 0.75, -0.25]) / (0.5 + EPS), rtol=0, atol=1e-7)
    assert b.is_peer.tolist() == [False, False, True, True]
    assert b.needs_old_logp.tolist() == [False, False, True, True]  # π_R,old recomputed before the update
    assert row_ids(b, 2) == char_ids(recv, "12 34") and row_ids(b, 3) == char_ids(recv, "47")
    p = own[0].rollouts[0].prompt_ids.tolist()
    for row in range(4):  # every row after R's own prompt ids
        assert b.input_ids[row, b.input_ids.shape[1] - b.response_width - len(p):
                           b.input_ids.shape[1] - b.response_width].tolist() == p
    assert b.prompt_ids == [0, 0, 0, 0]
    assert plan.objective is None and b.gen_logp is None and b.cap_ratio is None  # None: DAPO
    assert_flows(plan, peers, {"s": {"consumed": 2}})
    assert flatten(plan.metrics) == {"prp/peer_rows": 2.0, "prp/peer_frac": 0.5, "prp/pool_size": 4.0,
                            "prp/peer_adv_mean": pytest.approx(0.25 / (0.5 + EPS), abs=1e-7)}


def test_peer_aligned_rows_carry_the_aligned_trace():
    # word groups of "12 34": "12" <- bpe '1','2' (-0.1 - 0.3 = -0.4 over 2 char tokens: -0.2 each) and
    # " 34"+EOS <- ' ','3','4',EOS (-0.2 - 0.4 - 0.6 - 0.8 = -2.0 over 4 char tokens: -0.5 each);
    # "47"+EOS: one word, -6.0 over 3 tokens: -2.0 each.
    recv, own, peers = scenario()
    assert plan_regime(get_regime("prp", denominator="peer_aligned"), recv, own, peers, 1).objective is None  # clip: DAPO
    plan = plan_regime(get_regime("prp", denominator="peer_aligned", objective="tis", is_cap=3.0), recv, own, peers, 1)
    b = plan.batch
    assert b.needs_old_logp.tolist() == [False] * 4
    torch.testing.assert_close(b.old_logp[2, :6], torch.tensor([-0.2, -0.2, -0.5, -0.5, -0.5, -0.5]))
    torch.testing.assert_close(b.old_logp[3, :3], torch.tensor([-2.0, -2.0, -2.0]))
    assert b.old_logp[3, 3:].eq(0).all()
    assert b.is_peer.tolist() == [False, False, True, True]  # the rows PRPTruncatedIS treats as peer rows
    assert (b.gen_logp, b.source_mean_logp, b.cap_ratio) == (None, None, None)  # the trace is their old_logp
    assert plan.objective == PRPTruncatedIS(is_cap=3.0)  # DAPO's terms: the algorithm's
    # span granularity: "12"+" "+"34" per character, identical spans -> the source trace unchanged
    plan = plan_regime(get_regime("prp", denominator="peer_aligned", granularity="span"), recv, own, peers, 1)
    torch.testing.assert_close(plan.batch.old_logp[2, :6], torch.tensor([-0.1, -0.3, -0.2, -0.4, -0.6, -0.8]))


RHO = [1.5, 0.5, 3.0, 1.0]


def one_peer_row(adv: float) -> PolicyBatch:
    """One peer row of 4 tokens, ``logp = 0`` and ``old_logp = −log ρ`` (so ``ρ = RHO``)."""
    return PolicyBatch(
        input_ids=torch.zeros(1, 5, dtype=torch.long), attention_mask=torch.ones(1, 5, dtype=torch.long),
        response_mask=torch.ones(1, 4), old_logp=-torch.log(torch.tensor([RHO])), advantages=torch.tensor([adv]),
        weights=torch.ones(1), is_peer=torch.tensor([True]), prompt_ids=[0],
    )


# token-mean over 4 tokens, ε_low 0.2, ε_high 0.28, C = 2. clip: Â = +1 -> -ρ/4 where ρ <= 1.28, else 0 (clipped);
# Â = -1 -> +ρ/4 where ρ >= 0.8, else 0. tis: -Â·min(ρ, 2)/4 everywhere (the weight is capped, never the direction).
EXPECTED_GRAD = {
    ("clip", 1.0): [0.0, -0.125, 0.0, -0.25],
    ("tis", 1.0): [-0.375, -0.125, -0.5, -0.25],
    ("clip", -1.0): [0.375, 0.0, 0.75, 0.25],
    ("tis", -1.0): [0.375, 0.125, 0.5, 0.25],
}


@pytest.mark.parametrize("denominator", ["learner_snapshot", "peer_aligned"])
@pytest.mark.parametrize("form", ["clip", "tis"])
@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_same_objective_form_under_both_denominators_hand_derived(denominator, form, adv):
    """The denominator decides only the peer rows' old log-probs; the objective form (``objective``) is the same
    under either, so given the same ratios both denominators give the same gradient (issue 23: Â = +1,
    ρ = [1.5, .5, 3, 1] -> clip [0, -.125, 0, -.25], tis [-.375, -.125, -.5, -.25])."""
    recv, own, peers = scenario()
    kw = {} if form == "clip" else {"objective": "tis"}
    plan = plan_regime(get_regime("prp", denominator=denominator, **kw), recv, own, peers, 1)
    assert plan.objective == {"clip": None, "tis": PRPTruncatedIS(is_cap=2.0)}[form]  # None: DAPO
    peer = plan.batch.is_peer
    if denominator == "learner_snapshot":  # π_R,old, recomputed by the update
        assert plan.batch.needs_old_logp.tolist() == peer.tolist()
    else:  # the aligned trace, kept
        assert not plan.batch.needs_old_logp.any()
        assert torch.equal(plan.batch.old_logp[peer], torch.stack([
            torch.nn.functional.pad(c.source_logp, (0, plan.batch.response_width - len(c.source_logp)))
            for c in plan.crossed]))
    logp = torch.zeros(1, 4, requires_grad=True)
    loss, _ = resolve(plan.objective, GRPOConfig().dapo()).loss(logp, one_peer_row(adv), Norms(None, None, 4))
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([EXPECTED_GRAD[(form, adv)]]), rtol=0, atol=1e-7)


def test_three_policies_missing_prompts_and_mini_batches_in_prompt_order():
    recv = FakeReceiver("r")
    own = [make_group("r", 0, [0, 0]), make_group("r", 1, [1, 0])]
    peers = {
        "s": [make_group("s", 0, [1, 1], kind="bpe"), make_group("s", 1, [1], kind="bpe"),
              make_group("s", 2, [1, 0], kind="bpe")],
        "t": [make_group("t", 1, [0, 0, 0])],
    }
    plan = plan_regime(get_regime("prp"), recv, own, peers, 2)
    b = plan.batch
    # rows: p0: R0 R0 S1 S1 | p1: R1 R0 S1 T0 T0 T0
    assert b.prompt_ids == [0] * 4 + [1] * 6
    assert b.is_peer.tolist() == [False, False, True, True, False, False, True, True, True, True]
    # p0 pool [0,0,1,1]: mean .5, var 1/3, std 0.5773503 -> ±0.5/(0.5773503+1e-6)
    a0 = 0.5 / (math.sqrt(1 / 3) + EPS)
    # p1 pool [1,0,1,0,0,0]: mean 1/3, Σ dev^2 = 2·4/9 + 4·1/9 = 4/3, var 4/15, std 0.5163978
    s1 = math.sqrt(4 / 15) + EPS
    expected = [-a0, -a0, a0, a0] + [(2 / 3) / s1, (-1 / 3) / s1, (2 / 3) / s1] + [(-1 / 3) / s1] * 3
    torch.testing.assert_close(b.advantages, torch.tensor(expected), rtol=0, atol=1e-6)
    assert plan.mini_batches == split_rows(10, 2) == [list(range(5)), list(range(5, 10))]
    assert_partition(plan)
    assert_flows(plan, peers, {"s": {"consumed": 3, "no_own_group": 2}, "t": {"consumed": 3}})
    metrics = flatten(plan.metrics)
    assert metrics["prp/peer_rows"] == 6.0 and metrics["prp/pool_size"] == 5.0


def test_no_peers_is_plain_grpo_and_all_pass_and_size_one():
    recv = FakeReceiver("r")
    own = [make_group("r", 0, [1, 0, 0]), make_group("r", 1, [1])]
    for denominator in ("learner_snapshot", "peer_aligned"):
        plan = plan_regime(get_regime("prp", denominator=denominator), recv, own, {}, 2)
        base = plan_regime(get_regime("none"), recv, own, {}, 2)
        assert plan.objective is None and plan.flows == {}  # DAPO
        assert torch.equal(plan.batch.input_ids, base.batch.input_ids) and plan.mini_batches == base.mini_batches
        torch.testing.assert_close(plan.batch.advantages, base.batch.advantages, rtol=0, atol=0)
    # all-pass pool: zero advantages for every row; size-1 R group with a size-1 peer: pool of 2
    peers = {"s": [make_group("s", 0, [1, 1, 1], kind="bpe")], "t": [make_group("t", 1, [1])]}
    own = [make_group("r", 0, [1, 1, 1]), make_group("r", 1, [0])]
    plan = plan_regime(get_regime("prp"), recv, own, peers, 1)
    a = 0.5 / (math.sqrt(0.5) + EPS)
    torch.testing.assert_close(plan.batch.advantages, torch.tensor([0.0] * 6 + [-a, a]), rtol=0, atol=1e-7)
    assert plan.batch.advantages[:6].eq(0).all()
    assert_flows(plan, peers, {"s": {"consumed": 3}, "t": {"consumed": 1}})


def test_args_validated():
    assert get_regime("prp").subscribes == ("rollout", "reward")
    for kw, msg in (({"denominator": "x"}, "denominator"), ({"granularity": "char"}, "granularity"),
                    ({"is_cap": 0.0}, "is_cap"), ({"objective": "ppo"}, "objective='ppo' is not one of: clip, tis")):
        with pytest.raises(ValueError, match=msg):
            get_regime("prp", **kw)


def tiny_batch(agg_rows=2, T=3):
    """Row 0: own (Â = -1, old = logp -> ρ = 1); row 1: peer (Â = 2, behaviour ℓ̃ = [-1, -1, -0.5])."""
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    logp0 = torch.tensor([[-0.7, -0.2, 0.0], [-0.5, -2.0, -0.5]])
    batch = PolicyBatch(
        input_ids=torch.zeros(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 5, dtype=torch.long),
        response_mask=mask, old_logp=torch.tensor([[-0.7, -0.2, 0.0], [-1.0, -1.0, -0.5]]),  # row 1: ℓ̃
        advantages=torch.tensor([-1.0, 2.0]), weights=torch.ones(2), is_peer=torch.tensor([False, True]),
        prompt_ids=[0, 0],
    )
    return batch, logp0


def test_prp_tis_loss_and_gradient_by_hand():
    # peer ρ = exp(logp - ℓ̃) = [e^0.5, e^-1, 1] = [1.6487213, 0.3678794, 1]; cap C = 1.5 -> w = [1.5, 0.3678794, 1]
    # token_count = 5; own tokens (ρ = 1, Â = -1): loss -Â·ρ = 1 each, grad -Â/5 = 0.2
    # peer tokens: loss -w·Â = [-3, -0.7357589, -2], grad -w·Â/5 = [-0.6, -0.1471518, -0.4]
    batch, logp0 = tiny_batch()
    logp = logp0.clone().requires_grad_(True)
    fn = PRPTruncatedIS(is_cap=1.5).with_algorithm(GRPOConfig().dapo())
    loss, m = fn.loss(logp, batch, Norms(batch.response_mask.sum(), 2, 3))
    w = torch.tensor([1.5, math.exp(-1), 1.0])
    assert loss.item() == pytest.approx((2.0 - (w * 2.0).sum().item()) / 5, abs=1e-6)
    loss.backward()
    expected = torch.tensor([[0.2, 0.2, 0.0], [-1.5 * 2 / 5, -math.exp(-1) * 2 / 5, -2 / 5]])
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-7)
    rho = torch.tensor([math.exp(0.5), math.exp(-1), 1.0])
    assert m.peer.is_trunc_frac.item() == pytest.approx(1 / 3)
    assert m.peer.is_abs_dev.item() == pytest.approx((rho - 1).abs().mean().item(), abs=1e-6)
    assert m.peer.ratio_mean.item() == pytest.approx(rho.mean().item(), abs=1e-6)
    assert m.own.ratio_mean.item() == pytest.approx(1.0)
    assert m.peer.num_tokens.item() == 3 and m.own.num_tokens.item() == 2


def test_prp_tis_own_rows_keep_the_dapo_clip_and_peer_weights_scale():
    batch, logp0 = tiny_batch()
    # own: ρ = e^0.4 > 1 + 0.28 with Â = -1 < 0 -> not clipped (min with -Â·ρ), grad -Â·ρ/5; peer weight 0.5
    logp0[0, :2] = torch.tensor([-0.3, 0.2])
    batch.weights = torch.tensor([1.0, 0.5])
    logp = logp0.clone().requires_grad_(True)
    fn = PRPTruncatedIS(is_cap=2.0).with_algorithm(GRPOConfig().dapo())
    loss, _ = fn.loss(logp, batch, Norms(5.0, 2, 3))
    loss.backward()
    r = math.exp(0.4)
    w = [min(math.exp(0.5), 2.0), math.exp(-1), 1.0]
    expected = torch.tensor([[r / 5, r / 5, 0.0], [-0.5 * w[0] * 2 / 5, -0.5 * w[1] * 2 / 5, -0.5 * w[2] * 2 / 5]])
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-6)
    # positive own advantage above 1 + ε_high is clipped: no gradient on those tokens
    batch.advantages = torch.tensor([1.0, 2.0])
    logp = logp0.clone().requires_grad_(True)
    fn.loss(logp, batch, Norms(5.0, 2, 3))[0].backward()
    assert logp.grad[0].eq(0).all()


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_prp_tis_is_micro_batch_invariant(agg):
    batch, logp0 = tiny_batch()
    cfg = GRPOConfig(agg=agg)
    fn = PRPTruncatedIS(is_cap=2.0).with_algorithm(cfg.dapo())
    tc, ns = batch.response_mask.sum(), 2
    whole = logp0.clone().requires_grad_(True)
    loss_whole, _ = fn.loss(whole, batch, Norms(tc, ns, 3))
    loss_whole.backward()
    parts = logp0.clone().requires_grad_(True)
    total = 0.0
    for rows in ([0], [1]):
        sub = batch.select(rows)
        loss, _ = fn.loss(parts[rows], sub, Norms(tc, ns, 3))
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(loss_whole.item(), abs=1e-7)
    torch.testing.assert_close(parts.grad, whole.grad, rtol=0, atol=1e-7)
    # without global normalisers the call normalises over all its rows (same as given)
    again, _ = fn.loss(logp0.clone(), batch, Norms(None, None, 3))
    assert again.item() == pytest.approx(loss_whole.item(), abs=1e-7)


@pytest.mark.parametrize("objective", ["clip", "tis"])
@pytest.mark.parametrize("denominator", ["learner_snapshot", "peer_aligned"])
def test_update_on_a_tiny_policy(denominator, objective):
    """The plan runs through ``update_policy``; learner_snapshot peer ratios are 1 at the first mini-batch, and
    with ``old_logp = recompute`` peer_aligned still uses the aligned trace (peer rows), not π_R,old; each
    objective form reports its own peer statistics."""
    from mutual_rl.model.policy import build_policy
    from mutual_rl.model.spec import PolicySpec, WarmStart
    from mutual_rl.update.loop import update_policy

    policy = build_policy(PolicySpec(name="r", model="tiny:llama-char", warmstart=WarmStart(steps=5)))
    recv, own, peers = scenario()
    plan = plan_regime(get_regime("prp", denominator=denominator, objective=objective), policy, own, peers, 1)
    params = [p for p in policy.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=0.01)
    m = update_policy(policy, plan, GRPOConfig(num_mini_batches=1), backward=lambda loss: loss.backward(),
                      step_optimizer=opt.step, zero_grad=lambda: opt.zero_grad(set_to_none=True))
    assert any(not torch.equal(p.detach(), b0) for p, b0 in zip(params, before))
    if denominator == "learner_snapshot":
        assert m.tokens.peer.ratio_mean == pytest.approx(1.0, abs=1e-5)
        assert m.tokens.own.ratio_mean == pytest.approx(1.0, abs=1e-5)
    else:
        with torch.no_grad():
            sub = plan.batch.select([2, 3])
            for p, b0 in zip(params, before):  # the policy before the step
                p.copy_(b0)
            logp, _ = policy.response_logp(sub.input_ids, sub.attention_mask, plan.batch.response_width, 1.0)
            rho = torch.exp(logp - sub.old_logp)
            mask = sub.response_mask
        assert m.tokens.peer.ratio_mean == pytest.approx(float((rho * mask).sum() / mask.sum()), rel=1e-4)
        if objective == "tis":
            assert m.tokens.peer.is_trunc_frac == pytest.approx(float(((rho > 2.0) * mask).sum() / mask.sum()),
                                                                abs=1e-6)
        else:  # the DAPO clip on the same ratios
            adv = sub.advantages.unsqueeze(-1)
            high = ((adv > 0) & (rho > 1.28)) * mask
            assert m.tokens.peer.clip_frac_high == pytest.approx(float(high.sum() / mask.sum()), abs=1e-6)
            assert m.tokens.peer.is_trunc_frac is None
