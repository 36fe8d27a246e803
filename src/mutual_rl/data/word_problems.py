"""Offline multi-step word problems with integer answers: :class:`WordProblemTask`.

Each *family* is one skill: a template with 3-5 random numbers, solved in 3-4 arithmetic steps, with the
numbers chosen so that every division is exact and every answer a non-negative integer (positive, in fact).
The problem text is ASCII (the character-level tiny tokenizer knows every character) and contains the
family's numbers as digits in a fixed order and no other digits, so the answer can be recomputed from the
text alone (the order, per family, is in :data:`FAMILIES`). Names, pronouns and objects come from small word
lists, picked by an integer mix of the problem's id (so a problem's text never depends on ``seed``).

=========  ==========================================================  ===============================
family     numbers, in text order                                      answer
=========  ==========================================================  ===============================
shopping   n1 items at p1 each, n2 items at p2 each, pays m dollars    m - (n1*p1 + n2*p2)
sharing    a boxes of b, d more, shared among c friends                (a*b + d) / c
travel     v mph for t1 hours, w mph for t2 hours, trip of D miles     D - (v*t1 + w*t2)
work       r per hour, h hours a day, d days, boxes of k               r*h*d / k
ages       A is x, B is y older, C is z times B, in w years            z*(x + y) + w
discount   price p, n bought, q% off the total, delivery s             n*p - n*p*q/100 + s
=========  ==========================================================  ===============================

Problem space of a family: every number tuple of its ranges (module constants) that meets its constraints,
enumerated in a fixed order; :meth:`WordProblemTask.space_size` gives the counts (7,386 for work to 38,720 for shopping).
Splits, per family, exactly as :class:`~mutual_rl.data.task.ArithmeticTask`'s per operator: ``num_heldout``
tuples drawn without replacement (rng ``"heldout:{seed}:{family}"``, independent of ``num_train``), ``num_train``
split evenly over the families and drawn from the tuples not held out (rng ``"train:{seed}:{family}"``; capped,
with an INFO note, when fewer remain), the train list shuffled (rng ``"order:{seed}"``), held-out grouped by
family. Train and held-out share no number tuple, hence no text (and no problem that differs only in a name).
Everything is deterministic across processes (string-seeded ``random.Random``, no ``hash()``).

``prompt_id = 4 * 10**8 + FAMILIES[family].code * 10**7 + index`` (``index``: the tuple's position in the
family's space), so ids are unique, stable across seeds, splits and sizes, and lie in ``[4.1e8, 4.7e8)``:
above :class:`~mutual_rl.data.task.ArithmeticTask`'s (< 4e8) and below file rows (offset >= 1e9).
:func:`decode_id` maps an id back to ``(family, numbers)``.

Answers: ``answer_format: boxed`` (default) expects a completion ending in ``\\boxed{14}``; the supervised
target (:meth:`WordProblemTask.target_text`) is a short worked solution,
``"3 * 4 = 12. 5 * 2 = 10. 12 + 10 = 22. 30 - 22 = 8. \\boxed{8}"``, and the default reward is ``math_verify``
(``boxed_integer_match`` also works). ``answer_format: integer`` expects the bare integer ``"8"`` (target ``"8"``,
reward ``integer_match``). The instruction belongs in each policy's ``prompt_template``, e.g. :data:`TEMPLATE`
``"{problem} Solve it step by step and put the final answer in \\\\boxed{}."``, with ``chat_template: true`` for
chat models.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import product
from typing import Literal

from mutual_rl.data.task import seeded_splits, select_split
from mutual_rl.types import Problem

log = logging.getLogger(__name__)

ID_BASE = 4 * 10**8
ID_BLOCK = 10**7
TEMPLATE = "{problem} Solve it step by step and put the final answer in \\boxed{}."
"""Recommended ``prompt_template`` for ``answer_format: boxed``."""
INTEGER_TEMPLATE = "{problem} Answer with only the number."
"""Recommended ``prompt_template`` for ``answer_format: integer``."""

NAMES = (("Ava", "she"), ("Liam", "he"), ("Mia", "she"), ("Noah", "he"), ("Emma", "she"), ("Omar", "he"),
         ("Lena", "she"), ("Ravi", "he"), ("Sofia", "she"), ("Kenji", "he"), ("Zara", "she"), ("Diego", "he"),
         ("Nora", "she"), ("Felix", "he"), ("Priya", "she"), ("Tom", "he"))
GOODS = ("notebooks", "pens", "mugs", "candles", "books", "toy cars", "plates", "socks", "posters", "puzzles",
         "markers", "towels")
TREATS = ("apples", "oranges", "cookies", "plums", "pears", "candies", "stickers", "marbles")
MADE = ("toys", "bottles", "candles", "bowls", "cups", "bricks", "buttons", "spoons")
STOCK = ("shirts", "lamps", "books", "games", "hats", "bags", "plants", "pillows")


def _mix(x: int) -> int:
    """A 32-bit integer mix (deterministic, well spread) used to pick words."""
    x &= 0xFFFFFFFF
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _unit(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _person(h: int) -> tuple[str, str]:
    return NAMES[h % len(NAMES)]


# --------------------------------------------------------------------------------------------- families
# Each family: (numbers) -> text given the word-pick value h, and (numbers) -> (steps, answer).


def _shopping_space() -> list[tuple[int, ...]]:
    out = []
    for n1, p1, n2, p2 in product(range(2, 10), range(2, 13), range(2, 10), range(2, 13)):
        cost = n1 * p1 + n2 * p2
        out.extend((n1, p1, n2, p2, 10 * (cost // 10 + j)) for j in range(1, 6))  # change in 1..50
    return out


def _shopping_text(v: tuple[int, ...], h: int) -> str:
    n1, p1, n2, p2, m = v
    name, pron = _person(h)
    g1 = GOODS[(h >> 4) % len(GOODS)]
    g2 = GOODS[((h >> 4) + 1 + (h >> 9) % (len(GOODS) - 1)) % len(GOODS)]  # never g1
    return (f"{name} buys {n1} {g1} for ${p1} each and {n2} {g2} for ${p2} each. {pron.capitalize()} pays with "
            f"${m}. How many dollars of change does {pron} get?")


def _shopping_solve(v: tuple[int, ...]) -> tuple[list[str], int]:
    n1, p1, n2, p2, m = v
    c1, c2 = n1 * p1, n2 * p2
    return [f"{n1} * {p1} = {c1}", f"{n2} * {p2} = {c2}", f"{c1} + {c2} = {c1 + c2}",
            f"{m} - {c1 + c2} = {m - c1 - c2}"], m - c1 - c2


def _sharing_space() -> list[tuple[int, ...]]:
    return [(a, b, d, c) for a, b, d, c in product(range(2, 13), range(3, 16), range(1, 41), range(2, 10))
            if (a * b + d) % c == 0]


def _sharing_text(v: tuple[int, ...], h: int) -> str:
    a, b, d, c = v
    name, pron = _person(h)
    t = TREATS[(h >> 4) % len(TREATS)]
    return (f"{name} has {a} boxes of {b} {t} each and gets {d} more. {pron.capitalize()} shares all the {t} "
            f"equally among {c} friends. How many {t} does each friend get?")


def _sharing_solve(v: tuple[int, ...]) -> tuple[list[str], int]:
    a, b, d, c = v
    s = a * b + d
    return [f"{a} * {b} = {a * b}", f"{a * b} + {d} = {s}", f"{s} / {c} = {s // c}"], s // c


def _travel_space() -> list[tuple[int, ...]]:
    out = []
    speeds, hours = range(20, 85, 5), range(1, 7)
    for v, t1, w, t2 in product(speeds, hours, speeds, hours):
        dist = v * t1 + w * t2
        out.extend((v, t1, w, t2, 50 * (dist // 50 + j)) for j in range(1, 4))  # left in 1..150
    return out


def _travel_text(v: tuple[int, ...], h: int) -> str:
    s1, t1, s2, t2, trip = v
    name, pron = _person(h)
    return (f"{name} drives at {s1} mph for {_unit(t1, 'hour')}, then at {s2} mph for {_unit(t2, 'hour')}. "
            f"The trip is {trip} miles long. How many miles does {pron} have left to drive?")


def _travel_solve(v: tuple[int, ...]) -> tuple[list[str], int]:
    s1, t1, s2, t2, trip = v
    d1, d2 = s1 * t1, s2 * t2
    return [f"{s1} * {t1} = {d1}", f"{s2} * {t2} = {d2}", f"{d1} + {d2} = {d1 + d2}",
            f"{trip} - {d1 + d2} = {trip - d1 - d2}"], trip - d1 - d2


def _work_space() -> list[tuple[int, ...]]:
    return [(r, h, d, k) for r, h, d, k in product(range(2, 31), range(2, 11), range(2, 8), (2, 3, 4, 5, 6, 8, 10, 12))
            if (r * h * d) % k == 0]


def _work_text(v: tuple[int, ...], h: int) -> str:
    r, hours, days, k = v
    name, pron = _person(h)
    m = MADE[(h >> 4) % len(MADE)]
    return (f"{name}'s machine makes {r} {m} per hour. It runs {hours} hours a day for {days} days. "
            f"{pron.capitalize()} packs the {m} in boxes of {k}. How many boxes does {pron} fill?")


def _work_solve(v: tuple[int, ...]) -> tuple[list[str], int]:
    r, hours, days, k = v
    per_day = r * hours
    total = per_day * days
    return [f"{r} * {hours} = {per_day}", f"{per_day} * {days} = {total}", f"{total} / {k} = {total // k}"], total // k


def _ages_space() -> list[tuple[int, ...]]:
    return [(x, y, z, w) for x, y, z, w in product(range(2, 31), range(1, 16), range(2, 5), range(1, 21))
            if z * (x + y) <= 90]


def _ages_text(v: tuple[int, ...], h: int) -> str:
    x, y, z, w = v
    i = h % len(NAMES)
    j = (i + 1 + (h >> 4) % (len(NAMES) - 1)) % len(NAMES)
    k = next(n for n in ((j + 1 + (h >> 8) % (len(NAMES) - 1)) % len(NAMES), (i + j) % len(NAMES), 0, 1, 2)
             if n not in (i, j))
    a, b, c = NAMES[i][0], NAMES[j][0], NAMES[k][0]
    return (f"{a} is {x} years old. {b} is {_unit(y, 'year')} older than {a}. {c} is {z} times as old as {b}. "
            f"How old will {c} be in {_unit(w, 'year')}?")


def _ages_solve(v: tuple[int, ...]) -> tuple[list[str], int]:
    x, y, z, w = v
    b = x + y
    return [f"{x} + {y} = {b}", f"{z} * {b} = {z * b}", f"{z * b} + {w} = {z * b + w}"], z * b + w


def _discount_space() -> list[tuple[int, ...]]:
    return [(p, n, q, s) for p, n, q, s in product(range(4, 61), range(2, 13), (5, 10, 15, 20, 25, 30, 40, 50),
                                                   range(3, 13))
            if (n * p * q) % 100 == 0]


def _discount_text(v: tuple[int, ...], h: int) -> str:
    p, n, q, s = v
    name, pron = _person(h)
    g = STOCK[(h >> 4) % len(STOCK)]
    return (f"A shop sells {g} for ${p} each. {name} buys {n} of them and gets {q}% off the total. Delivery "
            f"costs ${s}. How many dollars does {pron} pay in all?")


def _discount_solve(v: tuple[int, ...]) -> tuple[list[str], int]:
    p, n, q, s = v
    total = n * p
    off = total * q // 100
    return [f"{n} * {p} = {total}", f"{total} * {q} / 100 = {off}", f"{total} - {off} = {total - off}",
            f"{total - off} + {s} = {total - off + s}"], total - off + s


@dataclass(frozen=True)
class Family:
    """One template family (one skill): its id ``code``, number order, and generators."""

    code: int
    numbers: str
    space: Callable[[], list[tuple[int, ...]]]
    text: Callable[[tuple[int, ...], int], str]
    solve: Callable[[tuple[int, ...]], tuple[list[str], int]]


FAMILIES: dict[str, Family] = {
    "shopping": Family(1, "n1 p1 n2 p2 m", _shopping_space, _shopping_text, _shopping_solve),
    "sharing": Family(2, "a b d c", _sharing_space, _sharing_text, _sharing_solve),
    "travel": Family(3, "v t1 w t2 D", _travel_space, _travel_text, _travel_solve),
    "work": Family(4, "r h d k", _work_space, _work_text, _work_solve),
    "ages": Family(5, "x y z w", _ages_space, _ages_text, _ages_solve),
    "discount": Family(6, "p n q s", _discount_space, _discount_text, _discount_solve),
}
"""The families (skills), in default order; codes are part of the prompt ids: never reuse or renumber one."""
_CODE_TO_FAMILY = {f.code: name for name, f in FAMILIES.items()}
_SPACES: dict[str, list[tuple[int, ...]]] = {}  # per process; the spaces do not depend on any setting


def family_space(family: str) -> list[tuple[int, ...]]:
    """The number tuples of ``family`` in their fixed order (built once per process)."""
    if family not in _SPACES:
        _SPACES[family] = FAMILIES[family].space()
    return _SPACES[family]


def decode_id(prompt_id: int) -> tuple[str, tuple[int, ...]]:
    """``(family, numbers)`` of a word-problem ``prompt_id``; ``ValueError`` for an id outside the range."""
    rest = prompt_id - ID_BASE
    family = _CODE_TO_FAMILY.get(rest // ID_BLOCK) if rest >= 0 else None
    if family is None or not 0 <= rest % ID_BLOCK < len(family_space(family)):
        raise ValueError(f"prompt_id {prompt_id} is not a word-problem id (those are 4 * 10**8 + code * 10**7 + "
                         "index, with a family code of FAMILIES and an index below the family's space size)")
    return family, family_space(family)[rest % ID_BLOCK]


@dataclass
class WordProblemTask:
    """Offline multi-step integer word problems, one skill per family (module docstring).

    For chat models: ``WordProblemTask()`` (boxed answers, reward ``math_verify``) with
    ``prompt_template: "{problem} Solve it step by step and put the final answer in \\\\boxed{}."`` and
    ``chat_template: true`` per policy.
    """

    families: list[str] = field(default_factory=lambda: list(FAMILIES))
    """Families (skills): shopping, sharing, travel, work, ages, discount (default: all, in this order)."""
    num_train: int = 20000
    """Training problems in total, split evenly over families (capped at the distinct problems left)."""
    num_heldout: int = 400
    """Held-out problems per family (skill)."""
    seed: int = 0
    """Seed of the problem draws (not of the wording: a problem's text depends only on its numbers)."""
    answer_format: Literal["integer", "boxed"] = "boxed"
    """Expected completion: "boxed" (worked steps ending in "\\boxed{14}") or "integer" (just "14")."""

    def __post_init__(self) -> None:
        if isinstance(self.families, str) or not self.families:
            raise ValueError(f"WordProblemTask.families must be a non-empty list of family names from "
                             f"{list(FAMILIES)}, got {self.families!r}")
        bad = [f for f in self.families if f not in FAMILIES]
        if bad:
            raise ValueError(f"WordProblemTask.families: unknown {bad}; choose from {list(FAMILIES)}")
        if len(set(self.families)) != len(self.families):
            raise ValueError(f"WordProblemTask.families has duplicates: {self.families}; list each family once")
        for name in ("num_train", "num_heldout", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"WordProblemTask.{name} must be an integer, got {value!r}")
        if self.num_train < 0 or self.num_heldout < 0:
            raise ValueError(f"WordProblemTask.num_train and num_heldout must be >= 0, got {self.num_train}, "
                             f"{self.num_heldout}")
        if self.answer_format not in ("integer", "boxed"):
            raise ValueError(f"WordProblemTask.answer_format must be 'integer' or 'boxed', got {self.answer_format!r}")
        for f in self.families:
            size = self.space_size(f)
            if size <= self.num_heldout:
                raise ValueError(f"WordProblemTask: family {f!r} has only {size} distinct problems, not more than "
                                 f"num_heldout={self.num_heldout}; lower num_heldout")
        self._cache: dict[str, list[Problem]] = {}

    @property
    def skills(self) -> list[str]:
        """Skill names: the families, in order."""
        return list(self.families)

    @property
    def default_reward(self) -> str:
        """``"math_verify"`` for boxed answers, ``"integer_match"`` for bare integers."""
        return "math_verify" if self.answer_format == "boxed" else "integer_match"

    @staticmethod
    def space_size(family: str) -> int:
        """Number of distinct problems of ``family``."""
        return len(family_space(family))

    def _problem(self, family: str, index: int) -> Problem:
        fam = FAMILIES[family]
        pid = ID_BASE + fam.code * ID_BLOCK + index
        numbers = family_space(family)[index]
        return Problem(pid, fam.text(numbers, _mix(pid)), str(fam.solve(numbers)[1]), family)

    def problems(self, split: Literal["train", "heldout"], skills: list[str] | None = None) -> list[Problem]:
        """Problems of ``split``, optionally only those whose skill is in ``skills`` (e.g. ``["ages"]``)."""
        if not self._cache:
            self._cache = seeded_splits(self, self.families, log)
        return select_split(self._cache, split, skills, self.skills)

    def train_problems(self) -> list[Problem]:
        """All training problems (shuffled across families)."""
        return self.problems("train")

    def heldout_problems(self) -> list[Problem]:
        """All held-out problems (``num_heldout`` per family, grouped by family)."""
        return self.problems("heldout")

    def solution(self, problem: Problem) -> str:
        """The worked solution of a problem of this task, e.g. ``"6 * 4 = 24. 24 + 3 = 27. 27 / 9 = 3. \\boxed{3}"``."""
        family, numbers = decode_id(problem.prompt_id)
        steps, answer = FAMILIES[family].solve(numbers)
        if str(answer) != problem.answer:
            raise ValueError(f"problem {problem.prompt_id} has answer {problem.answer!r}, but its id decodes to a "
                             f"{family} problem with answer {answer}; pass a problem made by this task")
        return ". ".join(steps) + ". \\boxed{" + problem.answer + "}"

    def target_text(self, problem: Problem) -> str:
        """Supervised completion for warm-start SFT: the worked :meth:`solution` (boxed) or ``"14"`` (integer)."""
        return self.solution(problem) if self.answer_format == "boxed" else problem.answer
