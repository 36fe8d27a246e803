"""GRAFT's ablations as options of the regime: no compatibility weight (``compatibility="off"``), successes only
(``transfer="successes"``), no peer-last order (``peer_last="none"``, also in tests/regimes/test_graft.py), and
the gate's admitted fraction split by the peer response's reward. Hand-derived expectations on small synthetic
groups, then two trainer steps of each ablation, under a reward that makes GRAFT's candidates common: every plan
whose selection (recomputed here) is non-empty must graft, and every run must graft something."""

from __future__ import annotations

import math

import pytest
import torch

from mutual_rl.regimes import get_regime
from mutual_rl.regimes.base import group_key
from mutual_rl.regimes.graft import GRAFT, balanced_candidates, candidate_prompts
from mutual_rl.rewards import register_reward
from mutual_rl.rewards.base import available_rewards
from mutual_rl.stats import flatten
from mutual_rl.step.scoring import plan_regime
from tests.regimes.scenario import FakeReceiver, make_group
from tests.regimes.test_graft import F, P, _three, assert_flows, const_receiver, peer_rows, row_texts

E = math.exp
DELTA = E(-0.25)  # the third response of `_scored` has s exactly δ (dropped under the weighted gate)


def _scored(receiver_logp: float = -1.0):
    """Receiver ℓ̄_R = -1 on every crossed response; source group for prompt 0 with rewards [1, 0, 1, 0] and
    ℓ̄_S = [-1, -0.875, -0.75, -1.5], so s = [1, e^-0.125, e^-0.25 = δ, e^0.5]."""
    calls = []

    def logp(ids, width):
        calls.append(ids.shape[0])
        return torch.full((ids.shape[0], width), receiver_logp)

    recv = FakeReceiver("r", kind="char", logp_fn=logp)
    traces = [[-1.0] * 3, [-0.875] * 3, [-0.75] * 3, [-1.5] * 3]  # "4x" + EOS: 3 tokens each
    own = [make_group("r", 0, [0, 0]), make_group("r", 1, [1, 0])]
    peers = {"s": [make_group("s", 0, [1, 0, 1, 0], texts=["46", "47", "48", "49"], logps=traces,
                              advantages=[0.5, -0.5, 0.25, -0.25]),
                   make_group("s", 1, [0, 0, 0, 0])]}
    return recv, own, peers, calls


S_ALL = [1.0, E(-0.125), E(-0.25), E(0.5)]


def _split(plan):
    m = flatten(plan.metrics)
    return {k: m[k] for k in ("evaluated_success", "evaluated_failure", "admitted_success", "admitted_failure",
                              "admitted_frac_success", "admitted_frac_failure") if k in m}


# ------------------------------------------------------------------------------------------ the split metric
def test_weighted_gate_split_by_peer_reward():
    """Default rule: the success with s = δ is dropped; both failures (s = e^-0.125, e^0.5) pass the gate."""
    recv, own, peers, calls = _scored()
    plan = plan_regime(GRAFT(delta=DELTA), recv, own, peers, 1)
    assert_flows(plan, peers)
    assert plan.flows == {"s": {"consumed": 3, "compat_below_floor": 1, "not_candidate": 4}}
    assert sum(calls) == 4  # the whole group was evaluated
    assert _split(plan) == {"evaluated_success": 2.0, "evaluated_failure": 2.0, "admitted_success": 1.0,
                            "admitted_failure": 2.0, "admitted_frac_success": 0.5, "admitted_frac_failure": 1.0}
    assert flatten(plan.metrics)["admitted_frac"] == 0.75


def test_split_counts_without_any_evaluation_and_with_three_policies():
    plan = plan_regime(get_regime("graft"), const_receiver(), [make_group("r", 0, [1, 0, 0, 0])],
                                    {"s": [make_group("s", 0, [1, 1, 0, 0])]}, 1)
    assert _split(plan) == {"evaluated_success": 0.0, "evaluated_failure": 0.0, "admitted_success": 0.0,
                            "admitted_failure": 0.0}  # the fractions are absent: nothing was evaluated
    own, peers = _three()  # c's group for prompt 0 (1 success of 4) and b's for prompt 1 (2 of 4), s = 1
    plan = plan_regime(get_regime("graft"), const_receiver(), own, peers, 2)
    assert _split(plan) == {"evaluated_success": 3.0, "evaluated_failure": 5.0, "admitted_success": 3.0,
                            "admitted_failure": 5.0, "admitted_frac_success": 1.0, "admitted_frac_failure": 1.0}


# ------------------------------------------------------------------------------------------ no compatibility weight
def test_compatibility_off_grafts_every_response_with_weight_one():
    recv, own, peers, _ = _scored()
    plan = plan_regime(GRAFT(delta=DELTA, compatibility="off"), recv, own, peers, 1)
    assert_flows(plan, peers)
    assert plan.flows == {"s": {"consumed": 4, "not_candidate": 4}}  # no compat_below_floor
    rows = peer_rows(plan)
    b = plan.batch
    assert b.prompt_ids == [1, 1, 0, 0, 0, 0] and rows == [2, 3, 4, 5]
    assert row_texts(recv, b, rows) == ["46", "47", "48", "49"]
    assert torch.equal(b.weights, torch.ones(6))
    assert torch.equal(b.advantages[rows], torch.tensor([0.5, -0.5, 0.25, -0.25]))
    # s is still computed and logged; the receiver's log-probs stay the grafted rows' old log-probs (π_R,old)
    torch.testing.assert_close(plan.histograms["compat_s"], torch.tensor(S_ALL), rtol=0, atol=1e-7)
    assert torch.equal(b.old_logp[rows], -1.0 * b.response_mask[rows]) and not b.needs_old_logp.any()
    metrics = flatten(plan.metrics)
    assert metrics["admitted_frac"] == 1.0 and metrics["transferred_responses"] == 4
    assert _split(plan) == {"evaluated_success": 2.0, "evaluated_failure": 2.0, "admitted_success": 2.0,
                            "admitted_failure": 2.0, "admitted_frac_success": 1.0, "admitted_frac_failure": 1.0}


def test_compatibility_off_grafts_a_group_the_floor_would_drop_whole():
    recv = const_receiver(-3.0)  # s = exp(-3 + 0.5) < 0.8 for every response
    own = [make_group("r", 0, [0, 0]), make_group("r", 1, [1, 0])]
    peers = {"s": [make_group("s", 0, [1, 0]), make_group("s", 1, [0, 0])]}
    assert plan_regime(get_regime("graft"), recv, own, peers, 2).flows == {"s": {"compat_below_floor": 2,
                                                                         "not_candidate": 2}}
    plan = plan_regime(get_regime("graft", compatibility="off"), recv, own, peers, 2)
    assert_flows(plan, peers)
    assert plan.flows == {"s": {"consumed": 2, "not_candidate": 2}}
    assert plan.batch.prompt_ids == [1, 1, 0, 0] and plan.batch.is_peer.tolist() == [False, False, True, True]
    assert torch.equal(plan.batch.weights, torch.ones(4)) and plan.mini_batches == [[0, 1], [2, 3]]
    assert flatten(plan.metrics)["compat_s_max"] == pytest.approx(E(-2.5))


# ------------------------------------------------------------------------------------------ successes only
def test_successes_only_weighted():
    """Successes 0 and 2 are crossed and scored (s = 1 and δ): one admitted; the two failures not_success."""
    recv, own, peers, calls = _scored()
    plan = plan_regime(GRAFT(delta=DELTA, transfer="successes"), recv, own, peers, 1)
    assert_flows(plan, peers)
    assert plan.flows == {"s": {"consumed": 1, "compat_below_floor": 1, "not_success": 2, "not_candidate": 4}}
    assert sum(calls) == 2  # only the successes were evaluated
    b = plan.batch
    rows = peer_rows(plan)
    assert b.prompt_ids == [1, 1, 0] and rows == [2]
    assert row_texts(recv, b, rows) == ["46"]
    assert b.advantages[2].item() == 0.5 and b.weights[2].item() == 1.0  # source advantage, w = min(1, 1)
    torch.testing.assert_close(plan.histograms["compat_s"], torch.tensor([1.0, E(-0.25)]), rtol=0, atol=1e-7)
    assert flatten(plan.metrics)["admitted_frac"] == 0.5
    assert _split(plan) == {"evaluated_success": 2.0, "evaluated_failure": 0.0, "admitted_success": 1.0,
                            "admitted_failure": 0.0, "admitted_frac_success": 0.5}


def test_successes_only_without_compatibility_weight():
    recv, own, peers, _ = _scored()
    plan = plan_regime(GRAFT(delta=DELTA, transfer="successes", compatibility="off"), recv, own, peers, 2)
    assert_flows(plan, peers)
    assert plan.flows == {"s": {"consumed": 2, "not_success": 2, "not_candidate": 4}}
    b = plan.batch
    assert row_texts(recv, b, peer_rows(plan)) == ["46", "48"]
    assert torch.equal(b.advantages[2:], torch.tensor([0.5, 0.25])) and torch.equal(b.weights, torch.ones(4))
    assert plan.mini_batches == [[0, 1], [2, 3]]  # 2 own rows, then the 2 grafted successes last
    none = plan_regime(GRAFT(delta=DELTA, transfer="successes", compatibility="off", peer_last="none"), recv, own, peers, 2)
    assert none.batch.prompt_ids == [0, 0, 1, 1] and none.batch.is_peer.tolist() == [True, True, False, False]


def test_successes_only_with_three_policies_and_stored_peers():
    own, peers = _three()
    plan = plan_regime(get_regime("graft", transfer="successes"), const_receiver(), own, peers, 2)
    assert_flows(plan, peers)
    # same choice as the whole-group rule (prompt 0 from c, prompt 1 from b), then only their successes
    assert plan.flows == {"b": {"unbalanced": 4, "consumed": 2, "not_success": 2, "not_candidate": 8},
                          "c": {"consumed": 1, "not_success": 3, "other_source": 4, "not_candidate": 8}}
    b = plan.batch
    assert b.prompt_ids == [2] * 4 + [3] * 4 + [0] + [1] * 2
    expected = torch.cat([peers["c"][0].advantages[:1], peers["b"][1].advantages[:2]])
    assert torch.equal(b.advantages[8:], expected) and (expected > 0).all()
    metrics = flatten(plan.metrics)
    assert metrics["rescued/b"] == 1 and metrics["transferred_responses/b"] == 2
    assert metrics["rescued/c"] == 1 and metrics["transferred_responses/c"] == 1
    stored = plan_regime(get_regime("graft", balance=False, transfer="successes"),
        const_receiver(), [make_group("r", 0, F), make_group("r", 1, F)],
        {"s": [make_group("s", 0, [0, 1, 0, 1]), make_group("s", 1, P)]}, 1)
    assert stored.flows == {"s": {"consumed": 2, "not_success": 2, "not_candidate": 4}}  # all-pass: no candidate


def test_bad_ablation_choices():
    with pytest.raises(ValueError, match=r"compatibility='none'.*weighted, off"):
        get_regime("graft", compatibility="none")
    with pytest.raises(ValueError, match=r"transfer='all'.*group, successes"):
        get_regime("graft", transfer="all")


# ------------------------------------------------------------------------------------------ trainer
if "test_len_mod4" not in available_rewards():

    @register_reward("test_len_mod4")
    def _len_mod4(completion: str, answer: str) -> float:
        """Test-only reward: 1 iff the response length is a multiple of 4 (about one response in four succeeds, so
        all-fail groups next to a peer's mixed group, GRAFT's candidates, are common)."""
        return float(len(completion) % 4 == 0)


def _selected(regime: GRAFT, own, peers) -> int:
    """Receiver groups GRAFT's rule selects for this plan (candidates, balancing; any source), computed here."""
    thr = regime.success_threshold
    own_by = {group_key(g): g for g in own if g.rollouts}
    chosen = set()
    for groups in peers.values():
        peer_by = {group_key(g): g for g in groups if g.rollouts}
        cands = candidate_prompts(own_by, peer_by, thr)
        kept = balanced_candidates(cands, len(candidate_prompts(peer_by, own_by, thr))) if regime.balance \
            else set(cands)
        chosen |= kept
    return len(chosen)


ABLATIONS = [
    {"peer_last": "none", "delta": 0.0},
    {"compatibility": "off", "balance": False},
    {"transfer": "successes", "delta": 0.0, "balance": False},
]


@pytest.mark.slow
@pytest.mark.parametrize("args", ABLATIONS, ids=lambda a: "-".join(f"{k}={v}" for k, v in a.items()))
def test_ablation_two_trainer_steps(args, tmp_path, monkeypatch):
    """Two steps of each ablation (KL on, three policies, prompts repeated within a batch): every plan keeps the
    ablation's rule, every delivered response is accounted for, and every policy's weights change."""
    from tests.regimes.test_regime_options import run

    plans = []
    original = GRAFT.plan

    def recording(self, receiver, own, peers, num_mini_batches, scores=None):
        plan = original(self, receiver, own, peers, num_mini_batches, scores)
        plans.append((self, own, peers, plan))
        return plan

    monkeypatch.setattr(GRAFT, "plan", recording)
    m, rec, ex, before = run(tmp_path, "graft", args, lora=False, trio=True, reward="test_len_mod4")
    assert len(rec.rows) == 2 and len(plans) == 2 * 3
    # every ablation admits every evaluated response of a selected group (δ = 0, or no compatibility weight), so a
    # plan whose selection is non-empty must graft; and the run must graft something (a dead path fails here)
    selected = [_selected(regime, own, peers) for regime, own, peers, _ in plans]
    for n, (*_, plan) in zip(selected, plans):
        metrics = flatten(plan.metrics)
        assert metrics["transferred_groups"] == n
        if n:
            assert metrics["transferred_responses"] >= n and int(plan.batch.is_peer.sum()) >= n
    assert sum(selected) >= 1, selected
    for regime, own, peers, plan in plans:
        assert all(getattr(regime, k) == v for k, v in args.items())
        assert_flows(plan, peers)
        b, peer = plan.batch, plan.batch.is_peer
        mt = flatten(plan.metrics)
        assert mt["evaluated_success"] + mt["evaluated_failure"] == plan.histograms["compat_s"].numel()
        assert mt["admitted_success"] + mt["admitted_failure"] == int(peer.sum())
        if args.get("compatibility") == "off":
            assert torch.equal(b.weights, torch.ones(len(b)))
            assert all("compat_below_floor" not in f for f in plan.flows.values())
        if args.get("transfer") == "successes":
            assert mt["evaluated_failure"] == 0 and (b.advantages[peer] > 0).all()
        if args.get("peer_last") == "none":  # δ = 0 admits every response: rows in the receiver's group order
            assert b.prompt_ids == [g.prompt_id for g in own for _ in g.rollouts]
    for name in [s.name for s in m.specs]:
        changed = [k for k, v in m.named_parameters() if k.startswith(f"policies.{name}.") and v.requires_grad
                   and not torch.equal(before[k], v)]
        assert changed, f"{name}: no parameter changed"
        assert all(math.isfinite(r[f"{name}/kl"]) for r in rec.rows if f"{name}/kl" in r)
        assert all(f"{name}/evaluated_success" in r and f"{name}/admitted_failure" in r for r in rec.rows)
    for flow, counts in ex.totals().items():
        dropped = sum(v for k, v in counts.items() if k.startswith("dropped/"))
        assert counts.get("consumed", 0) + dropped == counts["delivered"] == 2 * 4 * 4, flow
