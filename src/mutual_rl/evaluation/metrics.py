"""Evaluation estimators (docs/methods.md §6) and their torchmetrics accumulators.

Estimators, per problem:

* ``pass_at_k(n, c, k)``: unbiased pass@k ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021); pass@1 = ``c / n``,
  i.e. the mean over the ``n`` samples. Averaged over problems by :func:`mean_pass_at_k` (pass@1 is thus the mean
  over samples, then over problems).
* ``majority_correct(answers, correct)``: maj@k, the majority vote over the extracted answers (ties share credit).

Accumulators (``torchmetrics.Metric``): every state is a sum (``dist_reduce_fx="sum"``), so under DDP/FSDP each
rank accumulates its shard of the held-out problems and ``compute()`` returns the mean over *all* problems of
all ranks (not a mean of per-rank means). Create them on the device the process group communicates on (CUDA for
NCCL).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from math import comb

import torch
from torchmetrics import Metric


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
    With answers ``["3", "4", None, None]`` and only "3" correct, "3" and "4" tie (1 vote each; the Nones do not
    vote) and the problem scores 0.5. No extracted answer at all scores 0. The verdict of an answer is that of
    its last sample (samples with equal extracted answers get equal verdicts from a deterministic reward).
    """
    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} answers but {len(correct)} verdicts")
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    leaders = [a for a, v in votes.items() if v == top]
    verdict = {a: ok for a, ok in zip(answers, correct) if a is not None}
    return sum(bool(verdict[a]) for a in leaders) / len(leaders)


class ProblemMean(Metric):
    """Mean over problems of a per-problem score (maj@k, greedy accuracy): sums of scores and of problems."""

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, scores: torch.Tensor) -> None:
        """scores: [P] per-problem values."""
        scores = torch.as_tensor(scores, dtype=torch.float64, device=self.total.device).reshape(-1)
        self.total += scores.sum()
        self.count += scores.numel()

    def compute(self) -> torch.Tensor:
        """Mean over all problems seen (of all ranks); 0 when there are none."""
        return self.total / self.count if int(self.count) else torch.zeros((), dtype=torch.float64)


class ProblemCount(ProblemMean):
    """Number of problems seen (of all ranks)."""

    higher_is_better = None

    def compute(self) -> torch.Tensor:
        return self.count.to(torch.float64)


class PassAtK(ProblemMean):
    """Mean over problems of unbiased pass@k from per-problem sample counts ``n`` and correct counts ``c``."""

    def __init__(self, k: int, **kwargs):
        super().__init__(**kwargs)
        if k < 1:
            raise ValueError(f"PassAtK: k must be >= 1, got {k}")
        self.k = int(k)

    def update(self, n: torch.Tensor, c: torch.Tensor) -> None:  # type: ignore[override]
        """n, c: [P] samples and correct samples per problem (need ``0 <= c <= n`` and ``n >= k``)."""
        ns, cs = torch.as_tensor(n).reshape(-1).tolist(), torch.as_tensor(c).reshape(-1).tolist()
        super().update(torch.tensor([pass_at_k(int(a), int(b), self.k) for a, b in zip(ns, cs)],
                                    dtype=torch.float64))


class ComplementarityCounts(Metric):
    """Joint all-fail / solved / all-pass counts of N policies on the same problems (GRAFT Fig. 1).

    ``update(correct, samples)`` takes ``[P, N]`` correct-sample counts (problem p, policy a) and optionally the
    ``[P, N]`` sample counts. States: ``all_fail[a]`` = #problems with ``c_a = 0``; ``solved[a, b]`` = #problems
    with ``c_a = 0`` and ``c_b >= 1``; ``all_pass[a, b]`` = #problems with ``c_a = 0`` and ``c_b = n_b`` (every
    sample of B correct; 0 when ``samples`` is not given). Diagonals are 0. The share of A's all-fail problems
    that B solves is ``solved[a, b] / all_fail[a]``; B's group there is *mixed* (``1 <= c_b < n_b``, what GRAFT
    can graft) on ``solved[a, b] - all_pass[a, b]`` of them.
    """

    full_state_update = False
    is_differentiable = False

    def __init__(self, num_policies: int, **kwargs):
        super().__init__(**kwargs)
        self.num_policies = int(num_policies)
        self.add_state("all_fail", torch.zeros(num_policies, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("solved", torch.zeros(num_policies, num_policies, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("all_pass", torch.zeros(num_policies, num_policies, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, correct: torch.Tensor, samples: torch.Tensor | None = None) -> None:
        """correct: [P, N] long, correct samples per problem and policy; samples: [P, N] samples drawn."""
        correct = torch.as_tensor(correct, device=self.all_fail.device).long().reshape(-1, self.num_policies)
        fail = (correct == 0).long()  # [P, N]
        self.all_fail += fail.sum(0)
        # [N, N] counts as a sum of outer products over problems (CUDA has no integer matmul); diagonal 0
        self.solved += (fail.unsqueeze(2) * (correct > 0).long().unsqueeze(1)).sum(0)
        if samples is not None:
            samples = torch.as_tensor(samples, device=correct.device).long().reshape(correct.shape)
            self.all_pass += (fail.unsqueeze(2) * ((correct == samples) & (samples > 0)).long().unsqueeze(1)).sum(0)

    def compute(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.all_fail, self.solved, self.all_pass
