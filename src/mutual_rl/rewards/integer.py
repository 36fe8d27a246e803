"""Integer rewards: fast, pure regex, binary 0/1 (see :mod:`mutual_rl.rewards.extract` for the exact rules).

* ``integer_match`` (strict; the default for the built-in task): if the completion has a ``\\boxed{``, the
  answer is the content of the last closed ``\\boxed{...}``; otherwise it is the whole completion. Either way,
  stripped of surrounding whitespace, it must fully match ``-?[0-9]+``. Reward 1.0 iff that integer equals
  the gold integer. So ``"46"``, ``" 46\\n"``, ``"\\boxed{46}"`` and ``"so \\boxed{46}"`` score 1 for gold
  ``"46"``; ``"46 47"``, ``"4 6"``, ``"the answer is 46"`` and ``"\\boxed{46"`` score 0 (listing several numbers
  cannot be rewarded).
* ``boxed_integer_match``: like ``integer_match`` but a closed ``\\boxed{...}`` is required.
* ``last_integer`` (lenient): the last ``-?[0-9]+`` anywhere in the completion equals the gold integer
  (``"12+34=46"`` scores 1 for 46; so does ``"45 46"``: do not use it where hacking matters).
* ``boxed_format``: 1.0 iff the completion has exactly one ``\\boxed{`` and it is closed; the content is not
  checked.

A gold answer that is not ``-?[0-9]+`` raises ``ValueError`` (a data error, not a wrong completion).
"""

from __future__ import annotations

from mutual_rl.rewards.base import RewardResult, register_reward
from mutual_rl.rewards.extract import (
    BOXED,
    count_boxed,
    gold_integer,
    last_boxed,
    last_integer_in,
    parse_integer,
)


def _integer_match(completion: str, answer: str, *, require_boxed: bool) -> RewardResult:
    gold = gold_integer(answer)
    if BOXED in completion:
        content = last_boxed(completion)
        if content is None:
            return RewardResult(0.0, "unclosed \\boxed{")
        value = parse_integer(content)
    elif require_boxed:
        return RewardResult(0.0, "no \\boxed{}")
    else:
        value = parse_integer(completion)
    if value is None:
        return RewardResult(0.0, "no answer found")
    return RewardResult(1.0 if value == gold else 0.0)


def integer_match_with_info(completion: str, answer: str) -> RewardResult:
    """:func:`integer_match` with the reason for a 0 (``"no answer found"``, ``"unclosed \\boxed{"``)."""
    return _integer_match(completion, answer, require_boxed=False)


@register_reward("integer_match")
def integer_match(completion: str, answer: str) -> float:
    """Strict integer exact match (module docstring)."""
    return _integer_match(completion, answer, require_boxed=False).value


@register_reward("boxed_integer_match")
def boxed_integer_match(completion: str, answer: str) -> float:
    """Strict integer exact match on the last closed ``\\boxed{...}``; no box scores 0."""
    return _integer_match(completion, answer, require_boxed=True).value


@register_reward("last_integer")
def last_integer(completion: str, answer: str) -> float:
    """Lenient: the last ``-?[0-9]+`` anywhere in the completion equals the gold integer."""
    gold = gold_integer(answer)
    return 1.0 if last_integer_in(completion) == gold else 0.0


@register_reward("boxed_format")
def boxed_format(completion: str, answer: str) -> float:
    """1.0 iff exactly one ``\\boxed{`` occurs and it is closed; ``answer`` is ignored."""
    del answer
    return 1.0 if count_boxed(completion) == 1 and last_boxed(completion) is not None else 0.0
