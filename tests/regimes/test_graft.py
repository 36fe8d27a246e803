"""GRAFT: candidate sets, balancing (ties, m = 0, stored-peer mode), N = 3 source choice, exact compatibility
weights, whole-group replacement with source advantages, peer-last mini-batches, flows that account for every
delivered response."""

from __future__ import annotations

import math

import pytest
import torch

from mutual_rl.regimes import get_regime
from mutual_rl.regimes.graft import GRAFT, balanced_candidates, compatibility_score, compatibility_weight
from mutual_rl.stats import flatten
from mutual_rl.step.scoring import plan_regime
from tests.regimes.scenario import FakeReceiver, make_group

F, P = [0, 0, 0, 0], [1, 1, 1, 1]  # all-fail / all-pass groups of 4


def const_receiver(value: float = -0.5, kind: str = "char") -> FakeReceiver:
    return FakeReceiver("r", kind=kind, logp_fn=lambda ids, w: torch.full((ids.shape[0], w), value))


def assert_flows(plan, peers):
    """Every delivered response of every source is accounted for exactly once."""
    assert set(plan.flows) == set(peers)
    for src, groups in peers.items():
        assert sum(plan.flows[src].values()) == sum(len(g.rollouts) for g in groups), src
        assert all(v > 0 for v in plan.flows[src].values())


def row_texts(recv, batch, rows):
    out = []
    for i in rows:
        ids = batch.input_ids[i, -batch.response_width:][batch.response_mask[i].bool()].tolist()
        out.append(recv.tokenizer.decode(ids, skip_special_tokens=True))
    return out


def peer_rows(plan):
    return plan.batch.is_peer.nonzero().squeeze(-1).tolist()


# ------------------------------------------------------------------------------------------ weights
def test_compatibility_weight_exact_values():
    r = torch.tensor([-1.0, -1.0, -1.5, -1.0, -3.0], dtype=torch.float64)
    s = torch.tensor([-1.0, -1.25, -1.0, -0.9, -1.0], dtype=torch.float64)
    w = compatibility_weight(r, s, delta=0.8)
    # s = [1, e^0.25 (capped at 1), e^-0.5 = 0.607 <= 0.8 (dropped), e^-0.1 = 0.905, e^-2 (dropped)]
    expected = torch.tensor([1.0, 1.0, 0.0, math.exp(-0.1), 0.0], dtype=torch.float64)
    torch.testing.assert_close(w, expected, rtol=0, atol=1e-15)
    assert float(compatibility_weight(-1.1, -1.0)) == pytest.approx(math.exp(-0.1), abs=1e-15)
    assert float(compatibility_weight(0.0, 0.0, delta=0.999)) == 1.0
    # s exactly at δ is dropped: s = 1 with δ = 1, s = 0.5 with δ = 0.5
    assert float(compatibility_weight(0.0, 0.0, delta=1.0)) == 0.0
    assert float(compatibility_score(-math.log(2.0), 0.0)) == 0.5
    assert float(compatibility_weight(-math.log(2.0), 0.0, delta=0.5)) == 0.0
    assert float(compatibility_weight(-math.log(2.0), 0.0, delta=0.4999)) == 0.5


def test_balanced_candidates_boundary_ties():
    cands = {0: 3, 1: 2, 2: 2, 3: 1}
    assert balanced_candidates(cands, 2) == {0, 1, 2}  # k_(2) = 2: both tied candidates stay
    assert balanced_candidates(cands, 1) == {0}
    assert balanced_candidates(cands, 0) == set()
    assert balanced_candidates(cands, 10) == {0, 1, 2, 3}
    assert balanced_candidates({}, 3) == set()


# ------------------------------------------------------------------------------------------ two policies
def test_whole_group_replacement_keeps_source_advantages():
    recv = const_receiver(-0.5)
    own = [make_group("r", 0, F), make_group("r", 1, [1, 0, 0, 0]), make_group("r", 2, F)]
    src_adv = [0.7, -0.3, -0.2, 0.123456789]  # arbitrary, must arrive unchanged
    peers = {"s": [
        make_group("s", 0, [1, 1, 0, 0], texts=["46", "46", "47", "48"], advantages=src_adv),  # candidate
        make_group("s", 1, F),  # reverse direction candidate (R mixed, S all-fail)
        make_group("s", 2, P),  # all-pass: k_S = n, not a candidate
    ]}
    plan = plan_regime(get_regime("graft"), recv, own, peers, 2)
    assert_flows(plan, peers)
    assert plan.flows == {"s": {"consumed": 4, "not_candidate": 8}}
    b = plan.batch
    assert len(b) == 12 and plan.objective is None  # DAPO
    # own rows: prompts 1 and 2 (prompt 0's failed group left); peer rows: S's whole group for prompt 0
    assert b.prompt_ids == [1] * 4 + [2] * 4 + [0] * 4
    assert b.is_peer.tolist() == [False] * 8 + [True] * 4
    assert row_texts(recv, b, range(8, 12)) == ["46", "46", "47", "48"]
    assert torch.equal(b.advantages[8:], torch.tensor(src_adv))
    assert torch.equal(b.advantages[:8], torch.cat([own[1].advantages, own[2].advantages]))
    assert torch.equal(b.weights, torch.ones(12))  # s = exp(-0.5 + 0.5) = 1
    assert not b.needs_old_logp.any()
    # peer old log-probs are the receiver's (its own old policy is the ratio's denominator), own ones the sampler's
    assert torch.equal(b.old_logp[8:], -0.5 * b.response_mask[8:])
    # peer-last in the batch (paper): 12 rows in the same 2 mini-batches of 6, the grafted rows in the last one
    assert plan.mini_batches == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    with pytest.raises(ValueError, match="peer_last"):  # the earlier extra-mini-batches rule is gone
        get_regime("graft", peer_last="extra")
    # no peer-last order (ablation): the grafted group stays in prompt 0's place
    none = plan_regime(get_regime("graft", peer_last="none"), recv, own, peers, 2)
    assert none.batch.prompt_ids == [0] * 4 + [1] * 4 + [2] * 4 and none.batch.is_peer[:4].all()
    assert none.mini_batches == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    m = flatten(plan.metrics)
    assert (m["candidates/s"], m["candidates_reverse/s"], m["selected/s"], m["rescued/s"]) == (1, 1, 1, 1)
    assert m["transferred_groups"] == 1 and m["transferred_responses"] == 4 and m["admitted_frac"] == 1.0
    assert torch.equal(plan.histograms["compat_s"], torch.ones(4))
    assert m["compat_s_mean"] == m["compat_s_min"] == m["compat_s_max"] == 1.0


def test_no_candidates():
    recv = const_receiver()
    own = [make_group("r", 0, [1, 0, 0, 0]), make_group("r", 1, P)]
    peers = {"s": [make_group("s", 0, [1, 1, 0, 0]), make_group("s", 1, [0, 1, 0, 0])]}
    plan = plan_regime(get_regime("graft"), recv, own, peers, 2)
    assert_flows(plan, peers)
    assert plan.flows == {"s": {"not_candidate": 8}}
    assert not plan.batch.is_peer.any() and len(plan.batch) == 8
    assert plan.mini_batches == [[0, 1, 2, 3], [4, 5, 6, 7]]
    metrics = flatten(plan.metrics)
    assert metrics["transferred_groups"] == 0 and metrics["admitted_frac"] == 0.0
    assert plan.histograms["compat_s"].numel() == 0 and "compat_s_mean" not in metrics


def test_one_direction_only_m_zero_and_stored_peer_mode():
    recv = const_receiver()
    own = [make_group("r", 0, F), make_group("r", 1, F)]
    peers = {"s": [make_group("s", 0, [1, 0, 0, 0]), make_group("s", 1, [1, 1, 1, 0])]}
    plan = plan_regime(get_regime("graft"), recv, own, peers, 1)
    assert_flows(plan, peers)
    assert plan.flows == {"s": {"unbalanced": 8}}  # |C_{R→S}| = 0 -> m = 0
    metrics = flatten(plan.metrics)
    assert metrics["candidates/s"] == 2 and metrics["selected/s"] == 0
    assert not plan.batch.is_peer.any() and plan.mini_batches == [list(range(8))]
    stored = plan_regime(get_regime("graft", balance=False), recv, own, peers, 1)
    assert_flows(stored, peers)
    assert stored.flows == {"s": {"consumed": 8}}
    assert stored.batch.is_peer.all() and stored.batch.prompt_ids == [0] * 4 + [1] * 4
    assert torch.equal(stored.batch.advantages, torch.cat([g.advantages for g in peers["s"]]))
    assert stored.mini_batches == [list(range(8))]  # no own rows left; 8 grafted rows, size ceil(8/1) = 8
    assert flatten(stored.metrics)["rescued/s"] == 2


def test_groups_of_size_one_never_transfer():
    recv = const_receiver()
    own = [make_group("r", 0, [0]), make_group("r", 1, [1])]
    peers = {"s": [make_group("s", 0, [1]), make_group("s", 1, [0])]}
    plan = plan_regime(get_regime("graft", balance=False), recv, own, peers, 2)
    assert_flows(plan, peers)
    assert plan.flows == {"s": {"not_candidate": 2}}  # k_S = 1 = n: no reward contrast
    metrics = flatten(plan.metrics)
    assert metrics["candidates/s"] == 0 and metrics["candidates_reverse/s"] == 0


def test_balancing_boundary_ties_kept():
    recv = const_receiver()
    own = [make_group("r", q, F) for q in range(4)] + [make_group("r", 4, [1, 0, 0, 0]),
                                                        make_group("r", 5, [1, 1, 0, 0])]
    peers = {"s": [make_group("s", 0, [1, 1, 1, 0]), make_group("s", 1, [1, 1, 0, 0]),
                   make_group("s", 2, [0, 0, 1, 1]), make_group("s", 3, [1, 0, 0, 0]),
                   make_group("s", 4, F), make_group("s", 5, F)]}
    plan = plan_regime(get_regime("graft"), recv, own, peers, 2)
    assert_flows(plan, peers)
    # C_{S→R} = {0: 3, 1: 2, 2: 2, 3: 1}, |C_{R→S}| = 2 -> m = 2: keep 0 and both k = 2 ties, cut prompt 3
    assert plan.flows == {"s": {"consumed": 12, "unbalanced": 4, "not_candidate": 8}}
    metrics = flatten(plan.metrics)
    assert metrics["selected/s"] == 3 and metrics["rescued/s"] == 3
    b = plan.batch
    assert b.prompt_ids == [3] * 4 + [4] * 4 + [5] * 4 + [0] * 4 + [1] * 4 + [2] * 4
    # 24 rows (12 own, then 12 grafted) in the same 2 mini-batches as without grafting
    assert plan.mini_batches == [list(range(12)), list(range(12, 24))]


# ------------------------------------------------------------------------------------------ compatibility
def test_compatibility_weights_and_floor_in_plan():
    recv = const_receiver(-1.0)  # ℓ̄_R = -1 for every crossed response
    traces = [[-1.0] * 3, [-0.875] * 3, [-0.75] * 3, [-1.5] * 3]  # "4x" + EOS: 3 source tokens each
    delta = float(torch.exp(torch.tensor(-0.25, dtype=torch.float64)))  # third response: s exactly δ
    own = [make_group("r", 0, [0, 0]), make_group("r", 1, [1, 0])]
    peers = {"s": [make_group("s", 0, [1, 0, 1, 0], texts=["46", "47", "48", "49"], logps=traces,
                              advantages=[0.5, -0.5, 0.25, -0.25]),
                   make_group("s", 1, [0, 0, 0, 0])]}
    plan = plan_regime(GRAFT(delta=delta), recv, own, peers, 1)
    assert_flows(plan, peers)
    assert plan.flows == {"s": {"consumed": 3, "compat_below_floor": 1, "not_candidate": 4}}
    s = torch.tensor([1.0, math.exp(-0.125), math.exp(-0.25), math.exp(0.5)])
    torch.testing.assert_close(plan.histograms["compat_s"], s, rtol=0, atol=1e-7)
    b = plan.batch
    rows = peer_rows(plan)
    assert row_texts(recv, b, rows) == ["46", "47", "49"]
    torch.testing.assert_close(b.weights[rows], torch.tensor([1.0, math.exp(-0.125), 1.0]), rtol=0, atol=1e-7)
    assert torch.equal(b.advantages[rows], torch.tensor([0.5, -0.5, -0.25]))
    assert b.prompt_ids == [1, 1, 0, 0, 0]  # R's failed group for prompt 0 replaced
    metrics = flatten(plan.metrics)
    assert metrics["admitted_frac"] == 0.75
    assert metrics["compat_s_min"] == pytest.approx(math.exp(-0.25))
    assert metrics["compat_s_max"] == pytest.approx(math.exp(0.5))
    # the gate at every δ of the grid, by outcome: successes s = 1, e^-0.25; failures s = e^-0.125, e^0.5
    grid = {k: v for k, v in metrics.items() if k.startswith("gate/admit_")}
    assert grid == {**{f"gate/admit_success@{d}": 1.0 for d in ("0.3", "0.5", "0.7")},
                    "gate/admit_success@0.8": 0.5, "gate/admit_success@0.9": 0.5,
                    **{f"gate/admit_failure@{d}": 1.0 for d in ("0.3", "0.5", "0.7", "0.8")},
                    "gate/admit_failure@0.9": 0.5}
    lo = math.exp(-0.25)
    assert metrics["gate/s_p50_success"] == pytest.approx((lo + 1.0) / 2)
    assert metrics["gate/s_p10_success"] == pytest.approx(lo + 0.1 * (1.0 - lo))


def test_whole_group_below_floor_keeps_own_group():
    recv = const_receiver(-3.0)  # s = exp(-3 + 0.5) < 0.8 for all
    own = [make_group("r", 0, [0, 0]), make_group("r", 1, [1, 0])]
    peers = {"s": [make_group("s", 0, [1, 0]), make_group("s", 1, [0, 0])]}
    plan = plan_regime(get_regime("graft"), recv, own, peers, 2)
    assert_flows(plan, peers)
    assert plan.flows == {"s": {"compat_below_floor": 2, "not_candidate": 2}}
    assert plan.batch.prompt_ids == [0, 0, 1, 1] and not plan.batch.is_peer.any()
    metrics = flatten(plan.metrics)
    assert metrics["rescued/s"] == 0 and metrics["selected/s"] == 1


def test_cross_tokenizer_means_each_in_own_tokenization():
    """Source bpe trace mean vs receiver char log-probs of the crossed text."""
    recv = FakeReceiver("r", kind="char", logp_fn=lambda ids, w: torch.arange(w, dtype=torch.float32)
                        .neg().expand(ids.shape[0], w) * 0.1)
    from tests.regimes.scenario import tokenizer

    n_src = len(tokenizer("bpe")("123", add_special_tokens=False)["input_ids"]) + 1
    trace = [-0.2] * (n_src - 1) + [-0.8]
    own = [make_group("r", 0, [0, 0]), make_group("r", 1, [1, 0])]
    peers = {"s": [make_group("s", 0, [1, 0], kind="bpe", texts=["123", "123"], logps=[trace, trace]),
                   make_group("s", 1, [0, 0], kind="bpe")]}
    plan = plan_regime(GRAFT(delta=0.0), recv, own, peers, 1)
    assert_flows(plan, peers)
    # receiver: "123" + EOS = 4 char tokens with log-probs 0, -0.1, -0.2, -0.3 -> mean -0.15
    src_mean = sum(torch.tensor(trace).double().tolist()) / n_src
    s = math.exp(-0.15 - src_mean)
    torch.testing.assert_close(plan.histograms["compat_s"], torch.tensor([s, s]), rtol=0, atol=1e-6)
    rows = peer_rows(plan)
    torch.testing.assert_close(plan.batch.weights[rows], torch.tensor([min(s, 1.0)] * 2), rtol=0, atol=1e-6)
    torch.testing.assert_close(plan.batch.old_logp[rows[0], :4], torch.tensor([0.0, -0.1, -0.2, -0.3]))


# ------------------------------------------------------------------------------------------ N = 3
def _three():
    own = [make_group("r", 0, F), make_group("r", 1, F), make_group("r", 2, [1, 0, 0, 0]),
           make_group("r", 3, [1, 0, 0, 0])]
    peers = {
        "b": [make_group("b", 0, [1, 0, 0, 0]), make_group("b", 1, [1, 1, 0, 0]), make_group("b", 2, F),
              make_group("b", 3, P)],
        "c": [make_group("c", 0, [1, 0, 0, 0]), make_group("c", 1, [0, 1, 0, 1]), make_group("c", 2, F),
              make_group("c", 3, F)],
    }
    return own, peers


def test_three_policies_pairwise_balancing_and_source_choice():
    own, peers = _three()
    plan = plan_regime(get_regime("graft"), const_receiver(), own, peers, 2)
    assert_flows(plan, peers)
    # (r, b): C = {0: 1, 1: 2}, |C_{r→b}| = 1 (prompt 3: b all-pass) -> keep prompt 1 only
    # (r, c): C = {0: 1, 1: 2}, |C_{r→c}| = 2 -> keep both
    # prompt 0: only c kept -> c; prompt 1: b and c tie at k = 2 -> b (first in policy order)
    assert plan.flows == {"b": {"unbalanced": 4, "consumed": 4, "not_candidate": 8},
                          "c": {"consumed": 4, "other_source": 4, "not_candidate": 8}}
    b = plan.batch
    assert b.prompt_ids[8:] == [0] * 4 + [1] * 4
    torch.testing.assert_close(b.advantages[8:], torch.cat([peers["c"][0].advantages, peers["b"][1].advantages]))
    metrics = flatten(plan.metrics)
    assert metrics["rescued/b"] == 1 and metrics["rescued/c"] == 1
    assert metrics["selected/b"] == 1 and metrics["selected/c"] == 2
    # policy_order puts c first: it wins the tie on prompt 1
    plan2 = plan_regime(get_regime("graft", policy_order=["c", "b"]), const_receiver(), own, peers, 2)
    assert_flows(plan2, peers)
    assert plan2.flows == {"b": {"unbalanced": 4, "other_source": 4, "not_candidate": 8},
                           "c": {"consumed": 8, "not_candidate": 8}}


def test_three_policies_highest_k_wins_over_order():
    own = [make_group("r", 0, F), make_group("r", 1, [1, 0, 0, 0])]
    peers = {"b": [make_group("b", 0, [1, 0, 0, 0]), make_group("b", 1, F)],
             "c": [make_group("c", 0, [1, 1, 1, 0]), make_group("c", 1, F)]}
    plan = plan_regime(get_regime("graft"), const_receiver(), own, peers, 1)
    assert_flows(plan, peers)
    assert plan.flows == {"b": {"other_source": 4, "not_candidate": 4}, "c": {"consumed": 4, "not_candidate": 4}}


def test_no_own_group_flow_and_bad_args():
    own = [make_group("r", 0, F)]
    peers = {"s": [make_group("s", 0, [1, 0, 0, 0]), make_group("s", 7, [1, 0, 0, 0])]}
    plan = plan_regime(get_regime("graft", balance=False), const_receiver(), own, peers, 1)
    assert_flows(plan, peers)
    assert plan.flows == {"s": {"consumed": 4, "no_own_group": 4}}
    with pytest.raises(ValueError, match="unknown arguments"):
        get_regime("graft", floor=0.3)
    assert GRAFT.subscribes == ("rollout", "reward", "advantage")


# ------------------------------------------------------------------------------------------ peer-last
def test_peer_last_order_in_update():
    """The update runs R's own mini-batches first, then the grafted ones (recorded per objective call)."""
    from mutual_rl.model.policy import build_policy
    from mutual_rl.model.spec import PolicySpec, WarmStart
    from mutual_rl.update.config import GRPOConfig
    from mutual_rl.update.loop import update_policy
    from tests.update.recording import Recording

    policy = build_policy(PolicySpec(name="r", model="tiny:llama-char", warmstart=WarmStart(steps=5)))
    own = [make_group("r", 0, [0, 0]), make_group("r", 1, [1, 0]), make_group("r", 2, [0, 1])]
    peers = {"s": [make_group("s", 0, [1, 0], kind="bpe"), make_group("s", 1, [0, 0], kind="bpe"),
                   make_group("s", 2, [0, 0], kind="bpe")]}
    plan = plan_regime(GRAFT(delta=0.0), policy, own, peers, 2)  # δ = 0 admits every response whatever s is
    assert_flows(plan, peers)
    assert plan.objective is None  # DAPO
    plan.objective = recording = Recording()
    # the grafted rows' old log-probs are the receiver's own (before the update), s = exp(ℓ̄_R − ℓ̄_S)
    rows = peer_rows(plan)
    sub = plan.batch.select(rows)
    with torch.no_grad():
        lp, _ = policy.response_logp(sub.input_ids, sub.attention_mask, sub.response_width, 1.0)
    torch.testing.assert_close(sub.old_logp, lp * sub.response_mask, rtol=0, atol=1e-5)
    r_mean = (lp * sub.response_mask).sum(-1) / sub.response_mask.sum(-1)
    s_expected = torch.exp(r_mean + 0.5)  # make_group's source traces are -0.5 per token
    torch.testing.assert_close(plan.histograms["compat_s"], s_expected, rtol=1e-5, atol=0)
    torch.testing.assert_close(sub.weights, s_expected.clamp(max=1.0), rtol=1e-5, atol=0)
    before = [p.detach().clone() for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.1)
    update_policy(policy, plan, GRPOConfig(num_mini_batches=2, old_logp="rollout", skip_zero_advantage=False),
                  backward=lambda loss: loss.backward(), step_optimizer=opt.step,
                  zero_grad=lambda: opt.zero_grad(set_to_none=True))
    calls = [(sub.is_peer.tolist(), list(sub.prompt_ids)) for _, sub, _ in recording.calls]
    # 6 rows (own 1, 1, 2, 2, then grafted 0, 0) in the same 2 mini-batches as without grafting, grafted last
    assert [c[1] for c in calls] == [[1, 1, 2], [2, 0, 0]]
    assert [c[0] for c in calls] == [[False, False, False], [False, True, True]]
    assert any((p.detach() != b).any() for p, b in zip(
        [p for p in policy.parameters() if p.requires_grad], before))
