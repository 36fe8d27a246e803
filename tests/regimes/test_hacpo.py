"""HACPO: capability-weighted pooled advantages, capability window and state, L_m schedule, and the sequence-level
objective's value and gradient (hand-derived), micro-batch invariance, KL term, an update on a tiny policy."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from mutual_rl.algorithms.hacpo import capability_ratio, hacpo_advantages, lower_bound
from mutual_rl.regimes import get_regime
from mutual_rl.regimes.hacpo import HACPO
from mutual_rl.stats import flatten
from mutual_rl.step.scoring import plan_regime
from mutual_rl.types import PolicyBatch
from mutual_rl.update.config import GRPOConfig
from mutual_rl.update.objectives import HACPOObjective, Norms
from tests.regimes.scenario import FakeReceiver, make_group
from tests.update.recording import Recording


def assert_flows(plan, peers):
    assert set(plan.flows) == set(peers)
    for src, groups in peers.items():
        assert sum(plan.flows[src].values()) == sum(len(g.rollouts) for g in groups), src


# ------------------------------------------------------------------------------------------ pure pieces
def test_capability_ratio_and_lower_bound():
    assert capability_ratio(0.25, 0.5) == 0.5
    assert capability_ratio(0.9, 0.01) == 10.0  # 90 clipped
    assert capability_ratio(0.0, 0.5) == 0.1  # 2e-8 clipped
    assert capability_ratio(0.3, 0.0) == 10.0  # floor 1e-8
    assert [lower_bound(m) for m in (0, 1, 4, 8, 100)] == pytest.approx([0.8, 0.825, 0.9, 1.0, 1.0], abs=1e-15)


def test_advantages_hand_values():
    # own [1, 0], peer [1, 1, 0] with P_R/P_S = 0.5: b = (1 + 0 + .5 + .5 + 0)/5 = 0.4;
    # pooled std (unbiased) of [1,0,1,1,0] = sqrt(1.2/4)
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    ratio = torch.tensor([1.0, 1.0, 0.5, 0.5, 0.5])
    own = torch.tensor([True, True, False, False, False])
    adv = hacpo_advantages(r, ratio, own)
    expected = (torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0], dtype=torch.float64) - 0.4) / (math.sqrt(0.3) + 1e-6)
    torch.testing.assert_close(adv, expected.float(), rtol=0, atol=1e-7)
    # identical rewards: plain mean, zero advantages (whatever the ratios)
    assert torch.equal(hacpo_advantages(torch.ones(3), torch.tensor([1.0, 10.0, 10.0]),
                                        torch.tensor([True, False, False])), torch.zeros(3))
    # b > 1 -> the learner's own mean: own [1, 0], peer [2] with ratio 10: b = 21/3 = 7 -> b = 0.5; std([1,0,2]) = 1
    adv = hacpo_advantages(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([1.0, 1.0, 10.0]),
                           torch.tensor([True, True, False]))
    expected = torch.tensor([0.5, -0.5, 1.5], dtype=torch.float64) / (1 + 1e-6)
    torch.testing.assert_close(adv, expected.float(), rtol=0, atol=0)
    # a single response: std 0, rewards identical -> 0
    assert torch.equal(hacpo_advantages(torch.tensor([1.0]), torch.ones(1), torch.tensor([True])), torch.zeros(1))


# ------------------------------------------------------------------------------------------ plan
def test_plan_pooled_advantages_row_inputs_flows_metrics_interleaved_option():
    """``row_order="interleaved"`` (ours, an option): pooled groups in prompt order, own rows first in each, split
    into ``num_mini_batches`` (every mini-batch mixes own and peer rows)."""
    recv = FakeReceiver("r")
    own = [make_group("r", 0, [1, 0]), make_group("r", 1, [0, 0])]  # P_r = 1/4
    peers = {"s": [make_group("s", 0, [1, 1], kind="bpe"), make_group("s", 1, [1, 0], kind="bpe"),
                   make_group("s", 5, [0, 0], kind="bpe")]}  # P_s = 3/6; prompt 5: no own group
    plan = plan_regime(get_regime("hacpo", row_order="interleaved"), recv, own, peers, 2)
    assert_flows(plan, peers)
    assert plan.flows == {"s": {"consumed": 4, "no_own_group": 2}}
    assert plan.objective == HACPOObjective(lower_start=0.8, lower_slope=0.025, lower_m0=0, lower_per_update=1,
                                            alpha=1.0, self_clip_low=3e-4, self_clip_high=4e-4,
                                            log_ratio_clamp=10.0, kl_peer_rows=False)  # KL: the algorithm's
    b = plan.batch
    assert b.prompt_ids == [0, 0, 0, 0, 1, 1, 1, 1]
    assert b.is_peer.tolist() == [False, False, True, True] * 2
    assert not b.needs_old_logp.any()
    # ratio P_r/P_s = 0.5. q0: [1,0,1,1], b = 2/4 = .5, std .5;  q1: [0,0,1,0], b = .5/4 = .125, std .5
    den = 0.5 + 1e-6
    expected = torch.tensor([0.5, -0.5, 0.5, 0.5, -0.125, -0.125, 0.875, -0.125]) / den
    torch.testing.assert_close(b.advantages, expected, rtol=0, atol=1e-6)
    assert torch.equal(b.cap_ratio, torch.tensor([1.0, 1.0, 0.5, 0.5] * 2))
    assert torch.equal(b.source_mean_logp[b.is_peer], torch.full((4,), -0.5))
    assert plan.mini_batches == [[0, 1, 2, 3], [4, 5, 6, 7]]
    m = flatten(plan.metrics)
    assert m["capability/r"] == 0.25 and m["capability/s"] == 0.5 and m["cap_ratio/s"] == 0.5
    assert m["L_m_first"] == 0.8 and m["m"] == 0.0 and m["peer_responses"] == 4.0
    assert HACPO.subscribes == ("rollout", "reward")


def test_plan_own_then_peer_order_and_twice_the_mini_batches_by_default():
    """Default (public HACPO code): R's own rows in GRPO's mini-batches first, then the peer rows in further
    mini-batches of the same size; advantages and inputs travel with their rows."""
    recv = FakeReceiver("r")
    own = [make_group("r", 0, [1, 0]), make_group("r", 1, [0, 0])]
    peers = {"s": [make_group("s", 0, [1, 1], kind="bpe"), make_group("s", 1, [1, 0], kind="bpe"),
                   make_group("s", 5, [0, 0], kind="bpe")]}  # as the interleaved test: P_r/P_s = 0.5
    plan = plan_regime(get_regime("hacpo"), recv, own, peers, 2)
    assert_flows(plan, peers)
    b = plan.batch
    assert b.prompt_ids == [0, 0, 1, 1, 0, 0, 1, 1]
    assert b.is_peer.tolist() == [False] * 4 + [True] * 4
    assert plan.mini_batches == [[0, 1], [2, 3], [4, 5], [6, 7]]  # updates 0-1 own, 2-3 peer
    den = 0.5 + 1e-6  # the same pooled advantages as the interleaved test, reordered with their rows
    expected = torch.tensor([0.5, -0.5, -0.125, -0.125, 0.5, 0.5, 0.875, -0.125]) / den
    torch.testing.assert_close(b.advantages, expected, rtol=0, atol=1e-6)
    assert torch.equal(b.cap_ratio, torch.tensor([1.0] * 4 + [0.5] * 4))
    assert torch.equal(b.source_mean_logp, torch.tensor([0.0] * 4 + [-0.5] * 4))
    # public code's shape: 4 own groups of 2 (8 rows) in 2 mini-batches of 4 -> two peer updates of 4 rows
    own4 = [make_group("r", q, [0, 1]) for q in range(4)]
    peers4 = {"s": [make_group("s", q, [1, 0], kind="bpe") for q in range(4)]}
    plan = plan_regime(get_regime("hacpo"), recv, own4, peers4, 2)
    assert [len(mb) for mb in plan.mini_batches] == [4, 4, 4, 4]
    assert [plan.batch.is_peer[mb].tolist() for mb in plan.mini_batches] == [[False] * 4] * 2 + [[True] * 4] * 2
    # two peers: twice as many peer rows -> four peer updates of the own size; a short peer tail: ceil
    peers2 = {"s": peers4["s"], "t": [make_group("t", q, [1, 0], kind="bpe") for q in range(4)]}
    assert [len(mb) for mb in plan_regime(get_regime("hacpo"), recv, own4, peers2, 2).mini_batches] == [4] * 6
    peers3 = {"s": [make_group("s", q, [1, 0, 1], kind="bpe") for q in range(2)]}
    assert [len(mb) for mb in plan_regime(get_regime("hacpo"), recv, own4, peers3, 2).mini_batches] == [4, 4, 3, 3]
    # no peer rows: GRPO's mini-batches exactly
    assert plan_regime(get_regime("hacpo"), recv, own4, {"s": []}, 2).mini_batches == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_row_order_is_validated():
    with pytest.raises(ValueError, match=r"row_order='shuffled' is not one of: own_then_peer, interleaved"):
        get_regime("hacpo", row_order="shuffled")


def _step(regime, step, r_rewards, s_rewards):
    own = [make_group("r", 0, r_rewards, step=step)]
    peers = {"s": [make_group("s", 0, s_rewards, step=step)]}
    plan = plan_regime(regime, FakeReceiver("r"), own, peers, 1)
    assert_flows(plan, peers)
    return plan


def _lower(plan, update_index: int = 0) -> float:
    o = plan.objective
    return lower_bound(o.lower_m0 + o.lower_per_update * update_index, o.lower_start, o.lower_slope)


def test_capability_window_lm_schedule_and_state_round_trip():
    reg = get_regime("hacpo", window=2, lower_schedule="step")  # the per-training-step schedule (kept to compare)
    p0 = _step(reg, 0, [1, 0], [0, 0])  # rates r .5, s 0
    m0 = flatten(p0.metrics)
    assert m0["capability/r"] == 0.5 and m0["capability/s"] == 1e-8
    assert m0["cap_ratio/s"] == 10.0 and _lower(p0) == 0.8 and _lower(p0, 3) == 0.8
    p1 = _step(reg, 1, [1, 1], [0, 0])
    assert flatten(p1.metrics)["capability/r"] == 0.75 and _lower(p1) == pytest.approx(0.825)
    state = copy.deepcopy(reg.state_dict())
    p2 = _step(reg, 2, [0, 0], [1, 0])  # window 2: r (1 + 0)/2, s (0 + .5)/2
    m2 = flatten(p2.metrics)
    assert m2["capability/r"] == 0.5 and m2["capability/s"] == 0.25
    assert m2["cap_ratio/s"] == 2.0 and _lower(p2) == pytest.approx(0.85)
    # resumed regime continues exactly
    other = HACPO(window=2, lower_schedule="step")
    other.load_state_dict(state)
    q2 = _step(other, 2, [0, 0], [1, 0])
    assert flatten(q2.metrics) == flatten(p2.metrics) and q2.objective == p2.objective
    assert torch.equal(q2.batch.advantages, p2.batch.advantages)
    assert other.state_dict() == reg.state_dict()
    # a replanned step replaces its entry instead of adding one
    p2b = _step(reg, 2, [1, 1], [1, 0])
    assert flatten(p2b.metrics)["capability/r"] == 1.0 and len(reg.state_dict()["windows"]["r"]) == 2


# ------------------------------------------------------------------------------------------ objective
def _batch(old, adv, is_peer, src, cap, mask):
    b, t = old.shape
    return PolicyBatch(
        input_ids=torch.zeros(b, t + 1, dtype=torch.long), attention_mask=torch.ones(b, t + 1, dtype=torch.long),
        response_mask=mask, old_logp=old, advantages=adv, weights=torch.ones(b), is_peer=is_peer,
        prompt_ids=list(range(b)), source_mean_logp=src, cap_ratio=cap,
    )


def _example():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.7], [-0.8, -1.2], [-0.3, -9.0], [-2.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.1, -2.1], [-0.5, -0.7], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0, 2.0, 1.0, -1.0])
    is_peer = torch.tensor([False, False, True, True, True])
    src = torch.tensor([0.0, 0.0, -0.9, -0.5, -1.5])
    cap = torch.tensor([1.0, 1.0, 0.5, 2.0, 1.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    return logp, _batch(old, adv, is_peer, src, cap, mask)


def hacpo_objective(cfg: GRPOConfig | None = None, lower: float = 0.8, **regime_args):
    """HACPO's objective as the regime builds it (its defaults), ``L_m = lower`` at the first update, completed with
    the KL of ``cfg`` (default: the algorithm's defaults)."""
    objective = dataclasses.replace(HACPO(**regime_args).objective, lower_start=lower)
    return objective.with_algorithm((cfg or GRPOConfig()).dapo())


def test_objective_value_gradient_and_metrics_hand_derived():
    logp, sub = _example()
    loss, m = hacpo_objective(lower=0.8).loss(logp, sub, Norms(None, 5, 2))
    loss.backward()
    s2 = math.exp(-0.2)  # row 2: s = e^{-0.1}, s^2
    # terms: row0 self s = e^.1 > 1 + 4e-4, Â > 0 -> 1.0004 (clipped, no grad); row1 self s = 1, Â = -1 -> -1;
    # row2 peer s in [.8, 1] -> s·s·2/.5 = 4 s²; row3 peer s = e^.2 -> clip 1 -> 1·1·1/2; row4 peer s = e^-.5 -> .8·.8·(-1)
    expected = -(1.0004 - 1.0 + 4 * s2 + 0.5 - 0.64) / 5
    assert float(loss.detach()) == pytest.approx(expected, abs=1e-6)
    grad = torch.zeros(5, 2)
    grad[1] = -(-1.0 * 1.0 / 2) / 5  # -(Â · s / |o|) / num_seqs
    grad[2] = -(2 * s2) / 5  # -(sg(s) · Â/cap · s / |o|) / num_seqs
    torch.testing.assert_close(logp.grad, grad, rtol=0, atol=1e-6)
    # token-weighted sequence metrics: self rows 0 (clipped, 2 tokens), 1; peer rows 2 (in), 3 (>1, 1 token), 4 (<L)
    assert float(m.own.clip_frac) == pytest.approx(0.5)
    assert float(m.peer.clip_frac_low) == pytest.approx(2 / 5)
    assert float(m.peer.clip_frac_high) == pytest.approx(1 / 5)
    assert float(m.own.num_tokens) == 4 and float(m.peer.num_tokens) == 5


def test_objective_alpha_and_lower_bound():
    logp, sub = _example()
    loss, _ = hacpo_objective(lower=0.95, alpha=2.0).loss(logp, sub, Norms(None, 5, 2))
    loss.backward()
    # row2: s = e^{-.1} = .905 < .95 -> clipped to .95, no grad: .95 · .95² · 4; row4 -> .95³ · (-1)
    expected = -(1.0004 - 1.0 + 4 * 0.95**3 + 0.5 - 0.95**3) / 5
    assert float(loss.detach()) == pytest.approx(expected, abs=1e-6)
    assert float(logp.grad[2].abs().sum()) == 0.0 and float(logp.grad[1, 0]) == pytest.approx(0.1)


@pytest.mark.parametrize("kl_peer_rows", [False, True])
def test_objective_micro_batch_invariant_with_kl(kl_peer_rows):
    """KL covers the learner's own rows (0, 1) only by default (public HACPO code); every row with kl_peer_rows."""
    cfg = GRPOConfig(kl_coef=1e-3, kl_kind="k3")
    logp, sub = _example()
    ref = logp.detach() - 0.1  # d = 0.1 per token: k3 = e^{-.1} + .1 - 1
    objective = hacpo_objective(cfg, kl_peer_rows=kl_peer_rows)
    loss, m = objective.loss(logp, sub, Norms(None, 5, 2), ref)
    loss.backward()
    k3 = math.exp(-0.1) + 0.1 - 1
    s2 = math.exp(-0.2)
    kl_seqs = 5 if kl_peer_rows else 2
    assert float(loss.detach()) == pytest.approx(-(1.0004 - 1.0 + 4 * s2 + 0.5 - 0.64) / 5 + 1e-3 * k3 * kl_seqs / 5,
                                                 abs=1e-6)
    assert float(m.rows.kl) == pytest.approx(k3, abs=1e-6)
    full_grad = logp.grad.clone()
    dk = 1 - math.exp(-0.1)  # d k3 / d logp
    expected = torch.tensor([[0.0, 0.0], [0.1, 0.1], [-0.4 * s2, -0.4 * s2], [0.0, 0.0], [0.0, 0.0]])
    kl_grad = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [1.0, 0.0], [0.5, 0.5]])
    if not kl_peer_rows:
        kl_grad[2:] = 0.0
    expected += 1e-3 * dk / 5 * kl_grad
    torch.testing.assert_close(full_grad, expected, rtol=0, atol=1e-7)
    # split into micro-batches with the mini-batch's num_seqs: losses add up, gradients identical
    logp2 = logp.detach().clone().requires_grad_(True)
    total = 0.0
    for rows in ([0, 1], [2, 3, 4]):
        part = sub.select(rows)
        lp = logp2[rows]
        loss_i, _ = objective.loss(lp, part, Norms(None, 5, 2), ref[rows])
        loss_i.backward()
        total += float(loss_i.detach())
    assert total == pytest.approx(float(loss.detach()), abs=1e-7)
    torch.testing.assert_close(logp2.grad, full_grad, rtol=0, atol=1e-8)


# ------------------------------------------------------------------------------------------ update
def test_update_on_tiny_policy_with_kl():
    from mutual_rl.model.policy import build_policy
    from mutual_rl.model.spec import PolicySpec, WarmStart
    from mutual_rl.update.loop import update_policy

    policy = build_policy(PolicySpec(name="r", model="tiny:llama-char", warmstart=WarmStart(steps=5)),
                          needs_reference=True)
    own = [make_group("r", 0, [1, 0]), make_group("r", 1, [0, 0])]
    peers = {"s": [make_group("s", 0, [1, 1], kind="bpe"), make_group("s", 1, [1, 0], kind="bpe")]}
    plan = plan_regime(get_regime("hacpo"), policy, own, peers, 2)
    assert_flows(plan, peers)
    params = [p for p in policy.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=0.1)
    plan.objective = recording = Recording(plan.objective)
    m = update_policy(policy, plan, GRPOConfig(num_mini_batches=2, kl_coef=1e-3, kl_kind="k3"),
                      backward=lambda loss: loss.backward(), step_optimizer=opt.step,
                      zero_grad=lambda: opt.zero_grad(set_to_none=True))
    # (update_index, peer flags of the rows, L_m) of every objective call
    seen = [(u, sub.is_peer.tolist(), float(stats.rows.L_m)) for u, sub, stats in recording.calls]
    # own rows in updates 0-1, peer rows in updates 2-3, L_m = 0.8 + 0.025 m (0.85, 0.875 on the peer updates)
    assert [(u, set(p)) for u, p, _ in seen] == [(0, {False}), (1, {False}), (2, {True}), (3, {True})]
    assert [lm for *_, lm in seen] == pytest.approx([0.8, 0.825, 0.85, 0.875])
    assert all(math.isfinite(v) for v in m.metrics().values())
    assert m.tokens.peer.seq_ratio_mean is not None and m.tokens.rows.kl is not None and m.skipped_frac == 0.0
    assert any(bool((p.detach() != b).any()) for p, b in zip(params, before))
