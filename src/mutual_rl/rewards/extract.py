"""Answer extraction from completion text: pure string/regex functions, no sympy.

Rules (exact):

* ``last_boxed(text)``: the content of the last *closed* ``\\boxed{...}`` in ``text`` (braces nested inside
  are matched), or ``None`` if there is none. An unclosed last ``\\boxed{`` gives ``None``.
* ``count_boxed(text)``: how many ``\\boxed{`` openings ``text`` has.
* Integers are ASCII: ``INTEGER = -?[0-9]+`` (an optional minus, at least one digit; no ``+``, no spaces,
  no thousands separators, no Unicode digits). Leading zeros are allowed (``"046"`` is 46, ``"-0"`` is 0).
"""

from __future__ import annotations

import re

BOXED = "\\boxed{"
INTEGER_RE = re.compile(r"-?[0-9]+")


def last_boxed(text: str) -> str | None:
    """Content of the last closed ``\\boxed{...}`` (nested braces matched), else ``None``."""
    start = text.rfind(BOXED)
    if start < 0:
        return None
    depth = 1
    i = start + len(BOXED)
    begin = i
    while i < len(text):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i]
        i += 1
    return None


def count_boxed(text: str) -> int:
    """Number of ``\\boxed{`` openings in ``text``."""
    return text.count(BOXED)


def parse_integer(text: str) -> int | None:
    """``int(text.strip())`` if the stripped text fully matches ``-?[0-9]+``, else ``None``."""
    s = text.strip()
    return int(s) if INTEGER_RE.fullmatch(s) else None


def last_integer_in(text: str) -> int | None:
    """The last ``-?[0-9]+`` match anywhere in ``text`` (so ``"3-5"`` gives -5), else ``None``."""
    last = None
    for m in INTEGER_RE.finditer(text):
        last = m
    return int(last.group(0)) if last else None


def gold_integer(answer: str) -> int:
    """The gold answer as an int; a gold answer that is not ``-?[0-9]+`` is a data error and raises."""
    value = parse_integer(answer)
    if value is None:
        raise ValueError(
            f"gold answer {answer!r} is not an integer (-?[0-9]+); integer rewards need integer answers "
            "(use reward 'math_verify' for other answers)"
        )
    return value
