"""A prompt twice in one batch (the stream wraps around an epoch, or a file repeats a problem): every regime keys
groups by ``(prompt_id, group_id)``, pairs each receiver group with the peers' group of the same slot, and
accounts for every delivered response exactly once."""

from __future__ import annotations

import pytest
import torch

from mutual_rl.algorithms import grpo_advantages
from mutual_rl.regimes import get_regime
from mutual_rl.regimes.base import pair_peer_groups
from mutual_rl.stats import flatten
from mutual_rl.step.scoring import plan_regime
from tests.regimes.scenario import FakeReceiver, make_group

F = [0, 0, 0, 0]


def same_prompt(policy, rewards_by_slot, kind="char", step=0):
    """Groups of ``policy`` for prompt 7 in slots (group ids) 100, 101, ..."""
    return [make_group(policy, 7, r, kind=kind, group_id=100 + i, step=step) for i, r in enumerate(rewards_by_slot)]


def assert_flows(plan, peers):
    assert set(plan.flows) == set(peers)
    for src, groups in peers.items():
        assert sum(plan.flows[src].values()) == sum(len(g.rollouts) for g in groups), (src, plan.flows)


def test_pairing_by_identity_then_by_occurrence():
    own = same_prompt("r", [F, F])
    exact = {"s": list(reversed(same_prompt("s", [[1, 0, 0, 0], [1, 1, 0, 0]], kind="bpe")))}
    p = pair_peer_groups(own, exact)
    assert [g.group_id for _, g in p.by_own[(7, 100)]] == [100]
    assert [g.group_id for _, g in p.by_own[(7, 101)]] == [101]
    assert p.unmatched == {"s": []}
    # recorded traffic with other group ids: paired in order of occurrence, one group per receiver group
    other = {"s": [make_group("s", 7, [1, 0, 0, 0], group_id=5), make_group("s", 7, [0, 0, 0, 0], group_id=6),
                   make_group("s", 7, [0, 0, 0, 0], group_id=9), make_group("s", 8, F, group_id=8)]}
    p = pair_peer_groups(own, other)
    assert [g.group_id for _, g in p.by_own[(7, 100)]] == [5]
    assert [g.group_id for _, g in p.by_own[(7, 101)]] == [6]
    assert sorted(g.group_id for g in p.unmatched["s"]) == [8, 9]
    assert p.flows() == {"s": {"consumed": 8, "no_own_group": 8}}


@pytest.mark.parametrize("regime,args", [("xgrpo", {}), ("prp", {}), ("prp", {"denominator": "peer_aligned"}),
                                         ("sgt", {}), ("graft", {"delta": 0.0}), ("hacpo", {}),
                                         ("ftis", {})])
def test_every_regime_accounts_each_slot_once(regime, args):
    recv = FakeReceiver("r", logp_fn=lambda ids, w: torch.full((ids.shape[0], w), -0.5))
    own = same_prompt("r", [F, F, [1, 0, 0, 0]])
    peers = {"s": same_prompt("s", [[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]], kind="bpe"),
             "t": same_prompt("t", [[1, 0, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0]], kind="bpe")}
    plan = plan_regime(get_regime(regime, **args), recv, own, peers, 2)
    assert_flows(plan, peers)
    if regime in ("xgrpo", "prp", "hacpo", "ftis"):  # each pools its own slot's peer groups only: nothing counted twice
        assert all(f == {"consumed": 12} for f in plan.flows.values()), plan.flows
    rows = len(plan.batch)
    expected_rows = {"xgrpo": 12, "prp": 36, "hacpo": 36, "ftis": 36, "sgt": 12}.get(regime)
    if expected_rows is not None:
        assert rows == expected_rows


def test_xgrpo_pools_the_same_slot_only():
    recv = FakeReceiver("r")
    own = same_prompt("r", [[1, 0, 0, 0], [1, 0, 0, 0]])
    peers = {"s": same_prompt("s", [[1, 1, 1, 1], F], kind="bpe")}
    plan = plan_regime(get_regime("xgrpo"), recv, own, peers, 1)
    for slot, peer in ((0, [1.0] * 4), (1, [0.0] * 4)):
        pool = torch.tensor([1.0, 0, 0, 0] + peer)
        expected = grpo_advantages(pool, torch.zeros(8, dtype=torch.long))[:4]
        torch.testing.assert_close(plan.batch.advantages[4 * slot: 4 * slot + 4], expected, rtol=0, atol=1e-6)


def test_sgt_rescues_each_failed_slot_from_its_own_peer_group():
    recv = FakeReceiver("r")
    own = same_prompt("r", [F, F, [1, 0, 0, 0]])
    peers = {"s": same_prompt("s", [[1, 0, 0, 0], F, [1, 1, 0, 0]], kind="bpe")}
    plan = plan_regime(get_regime("sgt"), recv, own, peers, 3)
    assert_flows(plan, peers)
    # slot 0: gate open, one success drawn; slot 1: peer all-fail, gate closed; slot 2: R solved it, gate closed
    assert plan.flows == {"s": {"consumed": 1, "not_success": 3, "gate_closed": 8}}
    metrics = flatten(plan.metrics)
    assert metrics["rescued"] == 1.0 and metrics["gate_rate"] == pytest.approx(1 / 3)
    assert plan.nll is not None and [len(r) for r in plan.nll.mini_batches] == [1, 0, 0]


def test_graft_treats_each_slot_as_its_own_candidate():
    recv = FakeReceiver("r", logp_fn=lambda ids, w: torch.full((ids.shape[0], w), -0.5))
    own = same_prompt("r", [F, F, [1, 1, 0, 0]])  # slots 0, 1 fail; slot 2 mixed
    peers = {"s": same_prompt("s", [[1, 1, 0, 0], [1, 0, 0, 0], F], kind="bpe")}
    plan = plan_regime(get_regime("graft", delta=0.0), recv, own, peers, 2)
    assert_flows(plan, peers)
    # C_{S→R} = {slot 0: 2, slot 1: 1}, C_{R→S} = {slot 2}: m = 1 keeps slot 0 only
    metrics = flatten(plan.metrics)
    assert metrics["candidates/s"] == 2 and metrics["candidates_reverse/s"] == 1
    assert plan.flows == {"s": {"consumed": 4, "unbalanced": 4, "not_candidate": 4}}
    assert plan.batch.is_peer.tolist() == [False] * 8 + [True] * 4
    rewards_of_grafted = plan.batch.advantages[8:]
    torch.testing.assert_close(rewards_of_grafted, peers["s"][0].advantages)
