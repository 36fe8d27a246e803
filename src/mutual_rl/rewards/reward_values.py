"""What a reward returned, made plain: a float, ``None``, or a description (standard library only).

Used on both sides of a reward worker (:mod:`mutual_rl.rewards.reward_worker` imports this file by path): the
worker converts the reward's value *there*, so that only plain Python values cross back to the trainer (a torch
tensor or a NumPy scalar never has to be unpickled by the trainer); the in-process guards use the same rules.

* :func:`plain_number` (text-style rewards, ``fn(completion, answer) -> float``): a real number -- anything
  ``float()`` accepts but ``str``/``bytes``: ``float``, ``int``, ``bool``, a NumPy scalar or 0-d array, a torch
  tensor of one element with or without grad, on any device (``.detach()`` first) -- becomes its finite ``float``;
  ``None`` stays ``None``; anything else, or a non-finite number, becomes a :class:`Described` (its ``repr``, cut to
  200 characters, and its type name), which the guards report as "not a finite number".
* :func:`as_list` (TRL-style rewards, one value per completion): a list, tuple, 1-d array or tensor, or an
  iterator/generator that yields exactly ``n`` values, becomes a list; an unordered or keyed container (``set``,
  ``frozenset``, ``dict`` and its views, any ``Set`` or ``Mapping``), a ``str``/``bytes``, a non-iterable, or an
  iterator of another length becomes a :class:`Refused` whose text says what was returned and why it is refused.
  A generator is read at most ``n + 1`` values far.
* :func:`to_wire` / :func:`from_wire`: those values as plain tuples and lists for the worker's pipe.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import ItemsView, KeysView, Mapping, Set, ValuesView

PREVIEW = 200


class Described:
    """A reward's value that is not a finite number, as its ``repr`` (``text``) and ``type_name``."""

    def __init__(self, text: str, type_name: str):
        self.text, self.type_name = text, type_name

    def __repr__(self) -> str:
        return self.text


class Refused:
    """A TRL-style reward's value that is not one value per completion; ``text``: "<value> (<type>), <why>"."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return f"Refused({self.text!r})"


def describe(value) -> Described:
    if isinstance(value, Described):
        return value
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the value's type
        text = f"<{type(value).__name__} object>"
    return Described(text if len(text) <= PREVIEW else text[:PREVIEW] + "...", type(value).__name__)


def plain_number(value) -> float | None | Described:
    """The finite ``float`` of a real number, ``None`` for ``None``, else a :class:`Described` (module docstring)."""
    if value is None or isinstance(value, Described):
        return value
    if isinstance(value, (str, bytes, bytearray)):
        return describe(value)
    try:
        detach = getattr(value, "detach", None)
        number = float(detach() if callable(detach) else value)
    except Exception:  # noqa: BLE001 - whatever float() refuses is not a number
        return describe(value)
    return number if math.isfinite(number) else describe(value)


def _short(value) -> str:
    d = describe(value)
    text = d.text if len(d.text) <= 60 else d.text[:60] + "..."
    return f"{text} ({d.type_name})"


def as_list(value, n: int) -> list | Refused:
    """``value`` as a list of ``n`` entries (left as they are), or a :class:`Refused` (module docstring)."""
    if isinstance(value, (list, Refused)):
        return value if isinstance(value, Refused) or len(value) == n else _wrong_length(value, len(value), n)
    if isinstance(value, (Set, Mapping, KeysView, ItemsView, ValuesView)):
        return Refused(f"{_short(value)}, an unordered or keyed container: its values cannot be matched to the "
                       "completions (return a list, in the order of completions)")
    if isinstance(value, (str, bytes, bytearray, Described)):
        return Refused(f"{_short(value)}, not a list with one value per completion")
    try:
        it = iter(value)
    except TypeError:
        return Refused(f"{_short(value)}, not a list with one value per completion")
    if it is value:  # an iterator or a generator: read at most n + 1 values
        items = list(itertools.islice(it, n + 1))
        if len(items) != n:
            many = f"more than {n}" if len(items) > n else str(len(items))
            return Refused(f"a {type(value).__name__} that yields {many} values for {n} completions")
        return items
    items = list(it)
    return items if len(items) == n else _wrong_length(value, len(items), n)


def _wrong_length(value, k: int, n: int) -> Refused:
    return Refused(f"{k} values for {n} completions")


def plain(value, want):
    """The worker's conversion: ``want`` ``"number"`` -> :func:`plain_number`; an int ``n`` -> :func:`as_list`
    with each entry made a :func:`plain_number`."""
    if want == "number":
        return plain_number(value)
    items = as_list(value, int(want))
    return items if isinstance(items, Refused) else [plain_number(v) for v in items]


def to_wire(value):
    """A plain value as tuples and lists of ``float``/``None``/``str`` (for pickling between processes)."""
    if isinstance(value, Described):
        return ("described", value.text, value.type_name)
    if isinstance(value, Refused):
        return ("refused", value.text)
    if isinstance(value, list):
        return [to_wire(v) for v in value]
    return value


def from_wire(value):
    """Inverse of :func:`to_wire`."""
    if isinstance(value, tuple):
        return Described(*value[1:]) if value[0] == "described" else Refused(value[1])
    if isinstance(value, list):
        return [from_wire(v) for v in value]
    return value
