"""Record kinds: frozen, identity-carrying, and an exact ScoredGroup <-> records round trip."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mutual_rl.exchange import (
    AdvantageRecord,
    RewardRecord,
    Rollout,
    TraceRecord,
    groups_from_records,
    record_kind,
    records_from_group,
)
from tests.exchange.helpers import assert_groups_equal, make_group


def test_round_trip_is_exact():
    groups = [make_group("a", 7, 70, n=4, step=3, version=2), make_group("b", 7, 71, n=1), make_group("a", 8, 80)]
    records = [r for g in groups for r in records_from_group(g)]
    back = groups_from_records(records)
    assert len(back) == 3
    for g, h in zip(groups, back):
        assert_groups_equal(g, h)


def test_round_trip_keeps_dtypes_and_order_independent_of_scalar_order():
    g = make_group("a", 1, 10, n=3)
    g = dataclasses.replace(g, rewards=g.rewards.double(), advantages=g.advantages.to(torch.bfloat16))
    recs = records_from_group(g)
    rollouts = [r for r in recs if isinstance(r, Rollout)]
    scalars = [r for r in recs if not isinstance(r, Rollout)][::-1]  # reward/advantage order does not matter
    (h,) = groups_from_records(scalars + rollouts)
    assert_groups_equal(g, h)


def test_record_layout_and_identity():
    g = make_group("pol", 5, 50, n=2, step=9, version=4)
    recs = records_from_group(g, verifier="integer_match")
    assert [record_kind(r) for r in recs] == ["rollout"] * 2 + ["reward"] * 2 + ["advantage"] * 2
    rew = [r for r in recs if isinstance(r, RewardRecord)]
    assert [(r.policy_id, r.prompt_id, r.group_id, r.step, r.policy_version, r.index) for r in rew] == [
        ("pol", 5, 50, 9, 4, 0), ("pol", 5, 50, 9, 4, 1)]
    assert [r.value for r in rew] == g.rewards.tolist() and rew[0].verifier == "integer_match"
    adv = [r for r in recs if isinstance(r, AdvantageRecord)]
    assert [r.value for r in adv] == g.advantages.tolist()


@pytest.mark.parametrize("kind", ["rollout", "reward", "advantage", "trace"])
def test_records_are_frozen(kind):
    g = make_group("a", 1, 1)
    recs = {record_kind(r): r for r in records_from_group(g)}
    recs["trace"] = TraceRecord("a", 1, 1, 0, 0, 0, "b", torch.zeros(3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        recs[kind].policy_id = "x"


def test_incomplete_groups_raise_naming_the_group():
    recs = records_from_group(make_group("a", 3, 30, n=3))
    missing_reward = [r for r in recs if not (isinstance(r, RewardRecord) and r.index == 1)]
    with pytest.raises(ValueError, match=r"policy 'a', prompt 3, group 30.*reward records for indices \[0, 2\]"):
        groups_from_records(missing_reward)
    with pytest.raises(ValueError, match="duplicate advantage record for index 0"):
        groups_from_records(recs + [recs[-3]])
    with pytest.raises(ValueError, match="no rollout records"):
        groups_from_records([r for r in recs if not isinstance(r, Rollout)])


def test_inconsistent_group_is_rejected():
    g = make_group("a", 3, 30, n=3)
    with pytest.raises(ValueError, match=r"rewards \(2,\)"):
        records_from_group(dataclasses.replace(g, rewards=g.rewards[:2]))
    with pytest.raises(ValueError, match="rollout 0 has identity"):
        records_from_group(dataclasses.replace(g, policy_id="b"))
    with pytest.raises(TypeError, match="not an exchange record"):
        record_kind(g)
