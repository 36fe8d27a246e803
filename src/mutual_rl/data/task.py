"""The built-in verifiable task: integer arithmetic ``"12+34="`` -> ``"46"``.

Problem space of one operator: all ordered pairs ``(a, b)`` whose operands each have a digit count in
``digits`` (a 1-digit operand is 0..9, a d-digit one 10**(d-1)..10**d - 1); for ``"-"`` with
``allow_negative=False`` only pairs with ``a >= b``. The text is compact by default, ``f"{a}{op}{b}="`` (what the
tiny character-level policies learn, docs/calibration.md), or a question (``style``, below); the answer is
``str(a op b)``.

Splits, per operator (skill), deterministic from ``seed`` and independent of Python's hash seed:

* held-out: ``num_heldout`` pairs drawn uniformly without replacement (rng ``"heldout:{seed}:{op}"``); they do
  not depend on ``num_train``. A space smaller than ``num_heldout + 1`` raises ``ValueError``.
* train: ``num_train`` split evenly over the operators (the first ``num_train % len(operators)`` get one
  more), drawn uniformly without replacement from the pairs *not* held out (rng ``"train:{seed}:{op}"``);
  if fewer pairs remain, all of them are used and the cap is logged at INFO (e.g. 2-digit ``"+"`` has 8,100
  pairs, so the default 10,000 per operator is capped to 7,700). Train and held-out share no problem text.
  The train list is shuffled across operators (rng ``"order:{seed}"``); held-out is ordered by operator.

Text styles (``style``; the pair, answer, skill, ``prompt_id`` and split membership do not depend on it):

* ``"compact"`` (default): ``"12+34="``, ``"57-8="``, ``"6*7="``.
* ``"question"``: a chat question, ``"What is 12 + 34?"``, ``"What is 57 - 8?"``, ``"What is 6 * 7?"`` (ASCII
  ``*`` so that the character-level tiny tokenizer knows every character). The instruction on how to answer
  belongs in each policy's ``prompt_template`` (each policy may phrase it its own way), e.g.
  :data:`BOXED_TEMPLATE` ``"{problem} Put the final answer in \\boxed{}."`` with ``answer_format: boxed``, or
  :data:`INTEGER_TEMPLATE` ``"{problem} Answer with only the number."`` with ``answer_format: integer``; set
  ``chat_template: true`` on policies whose tokenizer has a chat template.

``default_reward``: ``integer_match`` for ``answer_format: integer`` (the completion must be the bare integer);
``boxed_integer_match`` for ``boxed``, in either style: the last box must hold exactly ``-?[0-9]+``, so
``"12 + 34 = 46, so \\boxed{46}"`` scores 1 and ``\\boxed{45}`` 0. **Not** ``math_verify``: on arithmetic questions
it can be gamed by restating the question, because the question's own expression equals the answer --
``"12 + 34 = \\boxed{}"`` and ``\\boxed{12+34}`` both verify as 46 (an empty box makes math-verify read the
expression before it). GRPO on SmolLM2-135M-Instruct found that within 40 steps (held-out "accuracy" 11 % -> 100 %
with every answer ``"a + b = \\boxed{}"``).

``prompt_id`` is derived from the content, so it is unique and stable across splits, seeds, sizes and styles:
``OPERATOR_CODES[op] * 10**8 + a * 10**4 + b`` (1xxxxxxxx for ``+``, 2... for ``-``, 3... for ``*``; below
4 * 10**8). Problems loaded from files (``data.files``) number rows from their ``id_offset``; give them an
offset of at least 10**9 to mix them with this task.
"""

from __future__ import annotations

import logging
import math
import operator as _op
import random
from dataclasses import dataclass, field
from typing import Literal

from mutual_rl.types import Problem

log = logging.getLogger(__name__)

SKILLS: dict[str, str] = {"+": "add", "-": "sub", "*": "mul"}
"""Skill name of each supported operator (used in logs and to filter problems)."""
OPERATOR_CODES: dict[str, int] = {"+": 1, "-": 2, "*": 3}
_APPLY = {"+": _op.add, "-": _op.sub, "*": _op.mul}
MAX_DIGITS = 4
STYLES = ("compact", "question")
BOXED_TEMPLATE = "{problem} Put the final answer in \\boxed{}."
"""Recommended ``prompt_template`` for question-style problems with ``answer_format: boxed``."""
INTEGER_TEMPLATE = "{problem} Answer with only the number."
"""Recommended ``prompt_template`` for question-style problems with ``answer_format: integer``."""




def _operands(digits: list[int]) -> list[int]:
    out: list[int] = []
    for d in sorted(digits):
        out.extend(range(0 if d == 1 else 10 ** (d - 1), 10**d))
    return out


def seeded_splits(task, keys: list[str], logger: logging.Logger) -> dict[str, list[Problem]]:
    """``{"train": [...], "heldout": [...]}`` of a task whose problems are indexed per skill key (an operator, a
    word-problem family): held-out ``task.num_heldout`` per key (rng ``"heldout:{seed}:{key}"``), train
    ``task.num_train`` split evenly over the keys and drawn from the rest (rng ``"train:{seed}:{key}"``; capped at
    what is left, logged at INFO on ``logger``), the train list shuffled across keys (rng ``"order:{seed}"``). The
    task gives ``space_size(key)``, ``_problem(key, index)`` and the fields ``num_train``, ``num_heldout``,
    ``seed``."""
    train: list[Problem] = []
    held_out: list[Problem] = []
    for k, key in enumerate(keys):
        size = task.space_size(key)
        held = random.Random(f"heldout:{task.seed}:{key}").sample(range(size), task.num_heldout)
        want = task.num_train // len(keys) + (1 if k < task.num_train % len(keys) else 0)
        avail = size - task.num_heldout
        if want > avail:
            logger.info("%s: %r has %d problems left after held-out; train capped %d -> %d",
                        type(task).__name__, key, avail, want, avail)
            want = avail
        held_set = set(held)
        cand = random.Random(f"train:{task.seed}:{key}").sample(range(size), min(size, want + task.num_heldout))
        train += [task._problem(key, i) for i in [i for i in cand if i not in held_set][:want]]
        held_out += [task._problem(key, i) for i in held]
    random.Random(f"order:{task.seed}").shuffle(train)
    return {"train": train, "heldout": held_out}


def select_split(cache: dict[str, list[Problem]], split: str, skills: list[str] | None,
                 known: list[str]) -> list[Problem]:
    """The problems of ``split`` in ``cache``, only those whose skill is in ``skills`` when given; unknown splits
    and skills are errors."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    if skills is not None:
        unknown = sorted(set(skills) - set(known))
        if unknown:
            raise ValueError(f"unknown skills {unknown}; this task has {known}")
    out = cache[split]
    return list(out) if skills is None else [p for p in out if p.skill in set(skills)]


@dataclass
class ArithmeticTask:
    """Built-in verifiable task: integer arithmetic with exact integer answers (module docstring).

    For chat models: ``ArithmeticTask(style="question", answer_format="boxed")`` (reward ``boxed_integer_match``) with
    ``prompt_template: "{problem} Put the final answer in \\boxed{}."`` and ``chat_template: true`` per policy.
    """

    operators: list[str] = field(default_factory=lambda: ["+", "-"])
    """Operators, one skill each; supported: "+", "-", "*"."""
    digits: int | list[int] = 2
    """Digit count(s) of each operand, 1..4; with a list each operand may have any of them."""
    num_train: int = 20000
    """Training problems in total, split evenly over operators (capped at the distinct problems left)."""
    num_heldout: int = 400
    """Held-out problems per operator (skill); ≥ 400 per skill gives ~2-point standard error."""
    seed: int = 0
    """Seed of the problem draws."""
    answer_format: Literal["integer", "boxed"] = "integer"
    """Expected completion: "integer" ("46") or "boxed" ("\\boxed{46}"); the answer string is "46" either way."""
    allow_negative: bool = False
    """For "-": allow a < b (negative answers); if False only a >= b."""
    style: Literal["compact", "question"] = "compact"
    """Problem text: "compact" ("12+34=") or "question" ("What is 12 + 34?"); same problems and ids either way."""

    def __post_init__(self) -> None:
        if not self.operators:
            raise ValueError("ArithmeticTask.operators must not be empty; supported: '+', '-', '*'")
        bad = [o for o in self.operators if o not in SKILLS]
        if bad:
            raise ValueError(f"ArithmeticTask.operators: unsupported {bad}; supported: '+', '-', '*'")
        if len(set(self.operators)) != len(self.operators):
            raise ValueError(f"ArithmeticTask.operators has duplicates: {self.operators}")
        digits = [self.digits] if isinstance(self.digits, int) else list(self.digits)
        if not digits or any(not isinstance(d, int) or not 1 <= d <= MAX_DIGITS for d in digits):
            raise ValueError(
                f"ArithmeticTask.digits must be an int or list of ints in 1..{MAX_DIGITS}, got {self.digits}"
            )
        self._digits = sorted(set(digits))
        if self.num_train < 0 or self.num_heldout < 0:
            raise ValueError(
                f"num_train and num_heldout must be >= 0, got {self.num_train}, {self.num_heldout}"
            )
        if self.answer_format not in ("integer", "boxed"):
            raise ValueError(f"answer_format must be 'integer' or 'boxed', got {self.answer_format!r}")
        if self.style not in STYLES:
            raise ValueError(f"ArithmeticTask.style must be 'compact' (\"12+34=\") or 'question' "
                             f"(\"What is 12 + 34?\"), got {self.style!r}")
        self._values = _operands(self._digits)
        for o in self.operators:
            size = self.space_size(o)
            if size <= self.num_heldout:
                raise ValueError(
                    f"ArithmeticTask: operator {o!r} with digits={self.digits} has only {size} distinct problems, "
                    f"not more than num_heldout={self.num_heldout}; lower num_heldout or raise digits"
                )
        self._cache: dict[str, list[Problem]] = {}

    @property
    def skills(self) -> list[str]:
        """Skill names in operator order, e.g. ``["add", "sub"]``."""
        return [SKILLS[o] for o in self.operators]

    @property
    def default_reward(self) -> str:
        """Registered reward for ``answer_format``: "integer_match" or "boxed_integer_match" (either style; not
        math_verify, which restating the question games: see the module docstring)."""
        return "integer_match" if self.answer_format == "integer" else "boxed_integer_match"

    def space_size(self, op: str) -> int:
        """Number of distinct problems of operator ``op``."""
        m = len(self._values)
        return m * (m + 1) // 2 if (op == "-" and not self.allow_negative) else m * m

    def _pair(self, op: str, index: int) -> tuple[int, int]:
        m, vals = len(self._values), self._values
        if op == "-" and not self.allow_negative:  # triangular index -> (i, j), i >= j
            i = (math.isqrt(8 * index + 1) - 1) // 2
            return vals[i], vals[index - i * (i + 1) // 2]
        return vals[index // m], vals[index % m]

    def _problem(self, op: str, index: int) -> Problem:
        a, b = self._pair(op, index)
        pid = OPERATOR_CODES[op] * 10**8 + a * 10**4 + b
        text = f"{a}{op}{b}=" if self.style == "compact" else f"What is {a} {op} {b}?"
        return Problem(pid, text, str(_APPLY[op](a, b)), SKILLS[op])

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
        """Supervised completion for warm-start SFT: ``"46"`` or ``"\\boxed{46}"``."""
        return problem.answer if self.answer_format == "integer" else "\\boxed{" + problem.answer + "}"
