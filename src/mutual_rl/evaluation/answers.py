"""Answer extraction for maj@k: which answer a completion votes for, by the reward that scores it.

maj@k groups a problem's samples by their *extracted* answer, so the extraction must be the reward's own:

* ``integer_match`` (the built-in task): the strict integer rule of :mod:`mutual_rl.rewards.integer` — the last
  closed ``\\boxed{...}`` if the completion has a ``\\boxed{``, else the whole completion, stripped, must fully
  match ``-?[0-9]+``; the vote is the integer's canonical string (``"046"`` and ``"\\boxed{46}"`` both vote
  ``"46"``). Anything else does not vote (None).
* ``boxed_integer_match``: the same on the last closed ``\\boxed{...}`` only.
* ``last_integer``: the last ``-?[0-9]+`` anywhere.
* ``math_verify``: the string math-verify gives priority to, found without sympy (math-verify itself runs in a
  time-limited worker process that returns only the verdict): the last closed ``\\boxed{...}``, else the last
  ``$...$`` span, else the last number (``-?digits[.digits]`` or ``a/b``); normalised by dropping ``$``,
  whitespace, ``\\left``/``\\right``, ``\\!``/``\\,``/``\\;``, a trailing ``.`` and braces around the whole answer.
  *Deviation*: math-verify's parse is symbolic, so two answers it would call equal but that are written
  differently (``1/2`` and ``0.5``) vote separately here; each sample's *verdict* is still math-verify's.
* any other reward: the last closed ``\\boxed{...}`` if any, else the stripped completion (empty: no vote).

A reward given as a weighted list of terms (:mod:`mutual_rl.rewards.combined`) uses its first term's rule: its
``__name__`` is the first term's.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from mutual_rl.rewards.extract import BOXED, last_boxed, last_integer_in, parse_integer

AnswerFn = Callable[[str], "str | None"]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
_DOLLAR = re.compile(r"\$([^$]+)\$")
_SPACING = re.compile(r"\\left|\\right|\\[!,;]|\s+|\$")


def strict_integer_answer(text: str) -> str | None:
    """The integer ``integer_match`` reads from ``text`` as a canonical string, else None."""
    if BOXED in text:
        content = last_boxed(text)
        value = parse_integer(content) if content is not None else None
    else:
        value = parse_integer(text)
    return None if value is None else str(value)


def boxed_integer_answer(text: str) -> str | None:
    """The integer in the last closed ``\\boxed{...}`` (``boxed_integer_match``), else None."""
    content = last_boxed(text) if BOXED in text else None
    value = parse_integer(content) if content is not None else None
    return None if value is None else str(value)


def last_integer_answer(text: str) -> str | None:
    """The last ``-?[0-9]+`` anywhere (``last_integer``), else None."""
    value = last_integer_in(text)
    return None if value is None else str(value)


def normalize_math(s: str) -> str | None:
    """Spacing-insensitive form of a math answer string (module docstring); None if nothing is left."""
    s = _SPACING.sub("", s).rstrip(".")
    while _wrapped(s):
        s = s[1:-1]
    return s or None


def _wrapped(s: str) -> bool:
    """True iff ``s`` is ``{...}`` with the first brace closed by the last (``{1}+{2}`` is not)."""
    if len(s) < 2 or s[0] != "{" or s[-1] != "}":
        return False
    depth = 0
    for i, ch in enumerate(s):
        depth += (ch == "{") - (ch == "}")
        if depth == 0 and i < len(s) - 1:
            return False
    return True


def math_answer(text: str) -> str | None:
    """The answer math-verify would parse first (boxed, else ``$...$``, else last number), normalised."""
    if BOXED in text:
        content = last_boxed(text)
        return normalize_math(content) if content is not None else None
    spans = _DOLLAR.findall(text)
    if spans:
        return normalize_math(spans[-1])
    numbers = _NUMBER.findall(text)
    return normalize_math(numbers[-1]) if numbers else None


def generic_answer(text: str) -> str | None:
    """Last closed ``\\boxed{...}`` if any, else the stripped completion."""
    content = last_boxed(text) if BOXED in text else text
    content = content.strip() if content is not None else ""
    return content or None


ANSWER_EXTRACTORS: dict[str, AnswerFn] = {
    "integer_match": strict_integer_answer,
    "boxed_integer_match": boxed_integer_answer,
    "last_integer": last_integer_answer,
    "math_verify": math_answer,
}


def answer_extractor(reward) -> AnswerFn:
    """The extraction matching ``reward`` (a registered name or the reward function; by its ``__name__``)."""
    name = reward if isinstance(reward, str) else getattr(reward, "__name__", "")
    return ANSWER_EXTRACTORS.get(name, generic_answer)
