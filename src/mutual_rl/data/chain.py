"""Arithmetic chains with worked solutions: :class:`ChainTask`, the task of benchmark v4.

A problem is a chain of ``terms`` positive integers joined by one operator, ``"12+34+5="`` or ``"51-5-34="``, and
its supervised target (:meth:`ChainTask.target_text`) is a worked solution, one step per operation, then the boxed
answer::

    12+34+5=   ->   12+34=46. 46+5=51. \\boxed{51}
    51-5-34=   ->   51-5=46. 46-34=12. \\boxed{12}

With the default ``terms: 3`` a correct response is 29-31 characters (30-32 tokens with EOS for the character-level
tiny tokenizer, 22-27 for the byte-level BPE one), of which the answer's digits are 1-2: the regime where a
per-token mean log-likelihood (GRAFT's compatibility gate) is dominated by the steps, as on the papers' long
responses, rather than by the answer (benchmark v3's 3-4-token answers). The reward checks the final answer only
(``boxed_integer_match``: the last box must hold exactly the integer); the steps are not graded.

Problem space of one operator, for ``terms = k`` and ``max_value = N``: every intermediate value and the answer lie
in ``1..N`` and every operand is ``>= 1``. Both operators are indexed by the same set, the k-subsets
``c_1 < c_2 < ... < c_k`` of ``{1, ..., N}`` (``C(N, k)`` problems each; 156,849 for k = 3, N = 99), unranked in
colexicographic order (:func:`unrank_combination`):

* ``"+"``: operands ``c_1, c_2 - c_1, ..., c_k - c_{k-1}``; the running sums are ``c_2, ..., c_k``; answer ``c_k``.
* ``"-"``: ``c_k - (c_k - c_{k-1}) - ... - (c_2 - c_1)``; the running differences are ``c_{k-1}, ..., c_1``;
  answer ``c_1``. A subtraction chain is an addition chain read backwards, so the two skills are equally hard.

Splits per operator exactly as :class:`~mutual_rl.data.task.ArithmeticTask`'s (``seeded_splits``: ``num_heldout``
held out, ``num_train`` split evenly over the operators from the rest, deterministic from ``seed``). Skills are
``add`` and ``sub``, as in the arithmetic task, so warm-ups and evaluations that filter by skill work unchanged.

``prompt_id = 5 * 10**8 + (code - 1) * 5 * 10**7 + (terms - 2) * 10**7 + index`` (``code``: 1 for ``+``, 2 for
``-``; ``index < 10**7``): unique, stable across seeds and splits, in ``[5e8, 6e8)``, above the arithmetic task's
(< 4e8) and the word problems' (< 4.7e8) and below file rows (>= 1e9).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Literal

from mutual_rl.data.task import OPERATOR_CODES, SKILLS, seeded_splits, select_split
from mutual_rl.types import Problem

log = logging.getLogger(__name__)

ID_BASE = 5 * 10**8
MAX_INDEX = 10**7
OPERATORS = ("+", "-")


def unrank_combination(index: int, k: int) -> list[int]:
    """The ``index``-th k-subset of the non-negative integers in colexicographic order, ascending
    (``0 -> [0, 1, ..., k-1]``); the combinatorial number system: ``index = Σ_i C(a_i, i + 1)``."""
    out = []
    for i in range(k, 0, -1):
        a = i - 1
        while math.comb(a + 1, i) <= index:  # the largest a with C(a, i) <= index
            a += 1
        out.append(a)
        index -= math.comb(a, i)
    return out[::-1]


@dataclass
class ChainTask:
    """Built-in verifiable task with worked solutions: chains of ``terms`` numbers joined by one operator
    (module docstring). Reward: ``boxed_integer_match``."""

    operators: list[str] = field(default_factory=lambda: ["+", "-"])
    """Operators, one skill each (add, sub); supported: "+", "-"."""
    terms: int = 3
    """Numbers per chain (2..4): terms - 1 worked steps."""
    max_value: int = 99
    """Upper bound of every intermediate value and answer (operands and values are >= 1)."""
    num_train: int = 20000
    """Training problems in total, split evenly over operators."""
    num_heldout: int = 400
    """Held-out problems per operator (skill)."""
    seed: int = 0
    """Seed of the problem draws."""
    answer_format: Literal["boxed"] = "boxed"
    """The response ends in ``\\boxed{<answer>}`` (the only format: the steps come before it)."""

    def __post_init__(self) -> None:
        bad = [o for o in self.operators if o not in OPERATORS]
        if not self.operators or bad or len(set(self.operators)) != len(self.operators):
            raise ValueError(f"ChainTask.operators must be distinct operators from {list(OPERATORS)}, "
                             f"got {self.operators}")
        if not 2 <= self.terms <= 4:
            raise ValueError(f"ChainTask.terms must be 2, 3 or 4 (numbers per chain), got {self.terms}")
        if self.max_value < self.terms:
            raise ValueError(f"ChainTask.max_value must be >= terms ({self.terms}), got {self.max_value}")
        if self.num_train < 0 or self.num_heldout < 0:
            raise ValueError(f"ChainTask.num_train and num_heldout must be >= 0, got {self.num_train}, "
                             f"{self.num_heldout}")
        if self.answer_format != "boxed":
            raise ValueError(f"ChainTask.answer_format must be 'boxed', got {self.answer_format!r}")
        size = self.space_size("+")
        if size >= MAX_INDEX:
            raise ValueError(f"ChainTask: {size} problems per operator (terms {self.terms}, max_value "
                             f"{self.max_value}) exceed the id block of {MAX_INDEX}; lower max_value or terms")
        if size <= self.num_heldout:
            raise ValueError(f"ChainTask: only {size} problems per operator, not more than num_heldout="
                             f"{self.num_heldout}; lower num_heldout or raise max_value")
        self._cache: dict[str, list[Problem]] = {}

    @property
    def skills(self) -> list[str]:
        """Skill names in operator order, e.g. ``["add", "sub"]``."""
        return [SKILLS[o] for o in self.operators]

    @property
    def default_reward(self) -> str:
        """``boxed_integer_match``: the last box must hold exactly the answer."""
        return "boxed_integer_match"

    def space_size(self, op: str) -> int:
        """Number of distinct problems of operator ``op``: ``C(max_value, terms)``."""
        return math.comb(self.max_value, self.terms)

    def chain(self, op: str, index: int) -> tuple[list[int], list[int]]:
        """``(numbers in text order, running values after each step)`` of problem ``index`` of ``op``."""
        c = [v + 1 for v in unrank_combination(index, self.terms)]  # c_1 < ... < c_k in 1..max_value
        diffs = [c[0]] + [c[i] - c[i - 1] for i in range(1, len(c))]
        if op == "+":
            return diffs, c[1:]
        return [c[-1]] + diffs[:0:-1], c[-2::-1]

    def _problem(self, op: str, index: int) -> Problem:
        numbers, values = self.chain(op, index)
        pid = ID_BASE + (OPERATOR_CODES[op] - 1) * 5 * MAX_INDEX + (self.terms - 2) * MAX_INDEX + index
        return Problem(pid, op.join(map(str, numbers)) + "=", str(values[-1]), SKILLS[op])

    def problems(self, split: Literal["train", "heldout"], skills: list[str] | None = None) -> list[Problem]:
        """Problems of ``split``, optionally only those whose skill is in ``skills`` (e.g. ``["add"]``)."""
        if not self._cache:
            self._cache = seeded_splits(self, self.operators, log)
        return select_split(self._cache, split, skills, self.skills)

    def train_problems(self) -> list[Problem]:
        """All training problems (shuffled across operators)."""
        return self.problems("train")

    def heldout_problems(self) -> list[Problem]:
        """All held-out problems (``num_heldout`` per operator, grouped by operator)."""
        return self.problems("heldout")

    def target_text(self, problem: Problem) -> str:
        """The worked solution, ``"12+34=46. 46+5=51. \\boxed{51}"`` (recomputed from the problem text)."""
        op = "+" if problem.skill == "add" else "-"
        numbers = [int(x) for x in problem.problem.rstrip("=").split(op)]
        steps, value = [], numbers[0]
        for n in numbers[1:]:
            nxt = value + n if op == "+" else value - n
            steps.append(f"{value}{op}{n}={nxt}.")
            value = nxt
        return " ".join(steps) + " \\boxed{" + str(value) + "}"
