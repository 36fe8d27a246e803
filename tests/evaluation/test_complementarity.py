"""Complementarity on a hand-built table of correct counts for three policies."""

from __future__ import annotations

import math

import pytest

from mutual_rl.evaluation.complementarity import complementarity


def test_scripted_three_policies():
    # problem: A, B, C correct counts (of k = 4)
    table = {
        1: (0, 2, 0),
        2: (0, 0, 1),
        3: (0, 1, 4),
        4: (3, 0, 0),
        5: (4, 4, 4),
        6: (0, 0, 0),
    }
    counts = {name: {pid: row[i] for pid, row in table.items()} for i, name in enumerate("ABC")}
    counts["C"][99] = 0  # only C saw problem 99: not common, ignored
    out = complementarity(counts)
    # A fails on 1, 2, 3, 6: B solves 1, 3; C solves 2, 3
    assert out["complementarity/A->B/all_fail"] == 4 and out["complementarity/A->B/solved"] == 2
    assert out["complementarity/A->B"] == 0.5
    assert out["complementarity/A->C"] == 0.5
    # B fails on 2, 4, 6: A solves 4; C solves 2
    assert out["complementarity/B->A"] == pytest.approx(1 / 3)
    assert out["complementarity/B->C"] == pytest.approx(1 / 3)
    # C fails on 1, 4, 6: A solves 4; B solves 1
    assert out["complementarity/C->A"] == pytest.approx(1 / 3)
    assert out["complementarity/C->B/solved"] == 1 and out["complementarity/C->B/all_fail"] == 3
    assert len(out) == 6 * 3


def test_no_all_fail_is_undefined_and_single_policy_is_empty():
    out = complementarity({"A": {1: 2, 2: 1}, "B": {1: 0, 2: 3}})
    assert math.isnan(out["complementarity/A->B"]) and out["complementarity/A->B/all_fail"] == 0
    assert out["complementarity/B->A"] == 1.0
    assert complementarity({"A": {1: 0}}) == {}


def test_mixed_and_all_pass_shares_of_the_peer_group():
    # the table of test_scripted_three_policies, k = 4 samples each
    table = {1: (0, 2, 0), 2: (0, 0, 1), 3: (0, 1, 4), 4: (3, 0, 0), 5: (4, 4, 4), 6: (0, 0, 0)}
    counts = {name: {pid: row[i] for pid, row in table.items()} for i, name in enumerate("ABC")}
    out = complementarity(counts, samples=4)
    # A fails on 1, 2, 3, 6. B: 2 of 4 on 1 and 1 of 4 on 3 -> 2 mixed, 0 all-pass; C: 1 of 4 on 2 (mixed), 4 of 4 on 3
    assert out["complementarity/A->B/mixed_frac"] == 0.5 and out["complementarity/A->B/all_pass_frac"] == 0.0
    assert out["complementarity/A->C/mixed_frac"] == 0.25 and out["complementarity/A->C/all_pass_frac"] == 0.25
    # B fails on 2, 4, 6: A has 3 of 4 on 4 (mixed); C has 1 of 4 on 2 (mixed)
    assert out["complementarity/B->A/mixed_frac"] == pytest.approx(1 / 3)
    assert out["complementarity/B->C/all_pass_frac"] == 0.0
    # per-policy sample counts: with n_C = 1 on problem 2, C's single correct sample is all-pass
    n = {name: {pid: 4 for pid in table} for name in "ABC"}
    n["C"][2] = 1
    out = complementarity(counts, samples=n)
    assert out["complementarity/A->C/mixed_frac"] == 0.0 and out["complementarity/A->C/all_pass_frac"] == 0.5
    assert len(out) == 6 * 5
    # without sample counts the two shares are absent
    assert "complementarity/A->B/mixed_frac" not in complementarity(counts)
