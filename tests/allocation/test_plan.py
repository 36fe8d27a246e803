"""MWRA planning: equal and adaptive plans, conservation of the total, update schedule, invalid budgets."""

from __future__ import annotations

import pytest

from mutual_rl.allocation import Budget, apportion, plan_budgets, update_ema, validate_budgets

NAMES = ["a", "b"]
MNT = {"a": 16, "b": 32}


def test_equal_plan_matches_configured_n():
    b = plan_budgets(NAMES, MNT, total=16, step=0)
    assert b == {"a": Budget(8, 16, True, "colocate"), "b": Budget(8, 32, True, "colocate")}


def test_equal_plan_remainder_goes_to_earlier_policies():
    b = plan_budgets(["a", "b", "c"], {"a": 4, "b": 4, "c": 4}, total=8, step=0)
    assert [b[k].n for k in "abc"] == [3, 3, 2]


def test_adaptive_hand_derived():
    # T=16, n_min=2 -> E=12; w = (0.05+0.5, 0.05+0.0) = (0.55, 0.05); q = 12*0.55/0.6 = 11, 12*0.05/0.6 = 1
    b = plan_budgets(NAMES, MNT, total=16, step=0, mode="adaptive", all_fail={"a": 0.5, "b": 0.0}, eps=0.05)
    assert (b["a"].n, b["b"].n) == (13, 3)
    # largest remainder: T=12, E=6, w=(0.35, 0.15, 0.25): q = 2.8, 1.2, 2.0 -> floors 2,1,2 (5), +1 to 'a'
    b = plan_budgets(["a", "b", "c"], {k: 4 for k in "abc"}, total=12, step=0, mode="adaptive",
                     all_fail={"a": 0.3, "b": 0.1, "c": 0.2}, eps=0.05)
    assert [b[k].n for k in "abc"] == [5, 3, 4]


def test_adaptive_without_statistics_is_equal():
    eq = plan_budgets(["a", "b", "c"], {k: 4 for k in "abc"}, total=11, step=0)
    ad = plan_budgets(["a", "b", "c"], {k: 4 for k in "abc"}, total=11, step=0, mode="adaptive")
    assert eq == ad


@pytest.mark.parametrize("total", [4, 5, 16, 33])
@pytest.mark.parametrize("fails", [(0.0, 0.0, 0.0), (1.0, 0.0, 0.3), (0.9, 0.9, 0.01)])
def test_total_conserved_and_floor_held(total, fails):
    names = ["a", "b"] if total < 6 else ["a", "b", "c"]
    stats = dict(zip(names, fails))
    b = plan_budgets(names, {k: 8 for k in names}, total=total, step=3, mode="adaptive", all_fail=stats)
    assert sum(x.n for x in b.values()) == total
    assert all(x.n >= 2 for x in b.values())


def test_more_all_fail_gets_more_rollouts():
    b = plan_budgets(NAMES, MNT, total=16, step=0, mode="adaptive", all_fail={"a": 0.1, "b": 0.6})
    assert b["b"].n > b["a"].n


def test_apportion_properties():
    assert apportion(7, [1, 1, 1], 0) == [3, 2, 2]
    assert apportion(6, [0, 1], 2) == [2, 4]
    with pytest.raises(ValueError, match="n_min"):
        apportion(3, [1, 1], 2)


def test_update_schedule_and_placement_carried():
    kw = dict(total=8, mode="equal", update_every={"b": 2}, placement={"b": 1})
    assert plan_budgets(NAMES, MNT, step=0, **kw)["b"].update
    assert not plan_budgets(NAMES, MNT, step=1, **kw)["b"].update
    assert plan_budgets(NAMES, MNT, step=1, **kw)["a"].update
    assert plan_budgets(NAMES, MNT, step=1, **kw)["b"].placement == 1


def test_ema():
    assert update_ema(None, 0.4, 0.9) == 0.4
    assert update_ema(0.4, 1.0, 0.5) == pytest.approx(0.7)
    assert update_ema(0.4, 1.0, 0.0) == 1.0


@pytest.mark.parametrize("kwargs, match", [
    (dict(update_every={"b": 0}), "never updates"),
    (dict(update_every={"zz": 1}), "unknown policy 'zz'"),
    (dict(all_fail={"zz": 0.5}, mode="adaptive"), "unknown policy 'zz'"),
    (dict(mode="greedy"), "not one of"),
    (dict(mode="adaptive", n_min=1), "n_min >= 2"),
    (dict(mode="adaptive", total=3), "n_min"),
    (dict(placement={"a": -1}), "device index"),
    (dict(placement={"a": "gpu0"}), "device index"),
])
def test_invalid_plans_rejected(kwargs, match):
    args = {"total": 8, "step": 0, **kwargs}
    with pytest.raises(ValueError, match=match):
        plan_budgets(NAMES, MNT, **args)


@pytest.mark.parametrize("budgets, match", [
    ({"a": Budget(0, 8), "b": Budget(8, 8)}, "must be >= 1"),
    ({"a": Budget(4, 0), "b": Budget(4, 8)}, "max_new_tokens"),
    ({"a": Budget(4, 8), "b": Budget(5, 8)}, "not the fixed total 8"),
    ({"a": Budget(4, 8), "b": Budget(4, 8), "c": Budget(1, 8)}, "unknown policies"),
    ({"a": Budget(8, 8)}, "no budget"),
    ({"a": Budget(4, 8, placement=3), "b": Budget(4, 8)}, "only 2 device"),
])
def test_validate_budgets_rejects(budgets, match):
    with pytest.raises(ValueError, match=match):
        validate_budgets(budgets, NAMES, total=8, num_devices=2)
