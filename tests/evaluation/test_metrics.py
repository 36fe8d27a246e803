"""pass@k against exhaustive enumeration, maj@k ties, and the torchmetrics accumulators."""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations

import pytest
import torch

from mutual_rl.evaluation.metrics import (
    PassAtK,
    ProblemCount,
    ProblemMean,
    majority_correct,
    mean_pass_at_k,
    pass_at_k,
)


def enumerated_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Share of the k-subsets of n samples (the first c correct) that hold at least one correct sample."""
    subsets = list(combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


@pytest.mark.parametrize("n", range(1, 7))
def test_pass_at_k_equals_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(enumerated_pass_at_k(n, c, k)), abs=1e-12)


def test_pass_at_1_is_mean_over_samples_then_problems():
    assert mean_pass_at_k([(4, 1), (8, 8), (2, 0)], 1) == pytest.approx((0.25 + 1 + 0) / 3)
    assert mean_pass_at_k([], 1) == 0.0


@pytest.mark.parametrize("bad", [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_rejects_invalid(bad):
    with pytest.raises(ValueError):
        pass_at_k(*bad)


def test_majority_ties_share_credit():
    assert majority_correct(["3", "4"], [True, False]) == 0.5
    assert majority_correct(["3", "4", "5"], [True, False, False]) == pytest.approx(1 / 3)
    assert majority_correct(["3", "4", "4", "3"], [True, False, False, True]) == 0.5


def test_majority_none_never_votes():
    # three samples without an answer cannot outvote one answer
    assert majority_correct([None, None, None, "7"], [False, False, False, True]) == 1.0
    assert majority_correct([None, "3", None, "4"], [False, True, False, False]) == 0.5
    assert majority_correct([None, None], [False, False]) == 0.0
    assert majority_correct([], []) == 0.0


def test_majority_plain_majority():
    assert majority_correct(["4", "4", "3"], [False, False, True]) == 0.0
    assert majority_correct(["3", "4", "3"], [True, False, True]) == 1.0
    with pytest.raises(ValueError):
        majority_correct(["3"], [True, False])


def test_torchmetrics_accumulators_match_the_estimators():
    counts = [(4, 0), (4, 1), (4, 3), (4, 4), (4, 2)]
    for k in (1, 2, 4):
        m = PassAtK(k)
        m.update(torch.tensor([n for n, _ in counts[:2]]), torch.tensor([c for _, c in counts[:2]]))
        m.update(torch.tensor([n for n, _ in counts[2:]]), torch.tensor([c for _, c in counts[2:]]))
        assert float(m.compute()) == pytest.approx(mean_pass_at_k(counts, k), abs=1e-12)
    mean = ProblemMean()
    mean.update(torch.tensor([1.0, 0.5]))
    mean.update(torch.tensor([0.0]))
    assert float(mean.compute()) == pytest.approx(0.5)
    count = ProblemCount()
    count.update(torch.ones(3))
    assert float(count.compute()) == 3.0
    empty = ProblemMean()
    empty.update(torch.tensor([]))
    assert float(empty.compute()) == 0.0


def test_states_reduce_by_sum():
    """A multi-rank reduction sums states: the mean is over all problems, not a mean of rank means."""
    a, b = ProblemMean(), ProblemMean()
    a.update(torch.tensor([1.0]))
    b.update(torch.tensor([0.0, 0.0, 0.0]))
    assert a._reductions["total"].__name__ == "dim_zero_sum" and a._reductions["count"].__name__ == "dim_zero_sum"
    a.merge_state(b)  # what the sum reduction does across ranks
    assert float(a.compute()) == pytest.approx(0.25)
