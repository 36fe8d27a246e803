"""Evaluation estimators (METHODS §6): pass@k (unbiased), pass@1 as mean over samples then problems, maj@k."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct among ``n`` samples: ``1 - C(n-c, k) / C(n, k)``."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Mean over problems of pass@k; ``counts`` holds (n, c) per problem. pass@1 = mean of c/n."""
    if not counts:
        return 0.0
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def majority_correct(answers: Sequence[str | None], correct: Sequence[bool]) -> float:
    """maj@k of one problem: 1 if the most frequent extracted answer is correct; ties share credit evenly.

    ``answers[i]`` is sample ``i``'s extracted answer (None = no answer, never voted), ``correct[i]`` its verdict.
    """
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    leaders = [a for a, v in votes.items() if v == top]
    verdict = {a: ok for a, ok in zip(answers, correct) if a is not None}
    return sum(verdict[a] for a in leaders) / len(leaders)
