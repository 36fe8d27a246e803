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
