"""TRL-style rewards: ``f(prompts, completions, **columns) -> list[float | None]``, one call per GRPO group.

A call covers the ``n`` rollouts of one prompt (one group), by keyword, each value a list of ``n`` entries aligned
with ``completions``:

* ``prompts``: the problem text (``Problem.problem``, before any policy's prompt or chat template), repeated;
* ``completions``: the response texts (without the prompt), plain strings;
* ``answer``: the gold answer string (after ``data.answer_regex``), repeated;
* one keyword per column of the dataset row (``Problem.columns``: every field but the problem and answer fields,
  values unchanged), repeated; the built-in task has none.

TRL's ``completion_ids`` and ``trainer_state`` are not passed. A function without ``**kwargs`` gets only the
keywords it names; naming one that is not there, or a dataset column called ``prompts``, ``completions`` or
``answer``, is a configuration error raised as :class:`~mutual_rl.rewards.guard.RewardError` in both error modes.

It returns one entry per completion (a list, tuple, 1-d array/tensor, or an iterator/generator yielding exactly one
value per completion; a ``set``, ``dict`` or other unordered or keyed container is refused, its order not being the
completions': :func:`~mutual_rl.rewards.reward_values.as_list`): a finite real number, or ``None`` for
"does not apply to this completion" (TRL's convention). ``None`` counts 0.0: in the weighted sum of
:mod:`mutual_rl.rewards.combined` and in the term's logged mean; as the first term it is not correct.

Time limit: the run's ``model.reward_timeout_s`` per completion, so a call on ``n`` completions may take ``n`` times
that; the mechanism is :class:`~mutual_rl.rewards.guard.GuardedReward`'s (a ``package.module:function`` reward runs in
its worker process, killed past the limit: :mod:`mutual_rl.rewards.isolation`; in process, an alarm in the main
thread, else a waited-for thread). A call that raises, times out, or returns the wrong number of entries or an entry that is not a finite
number or ``None`` is a failed call: with ``errors="raise"`` a ``RewardError`` naming the function, where, the prompt
and the answer; with ``errors="skip"`` every completion of the call scores 0.0 and each is counted (so
``reward_errors`` / ``reward_timeouts`` count completions, as for text-style rewards).

Style detection (:func:`reward_style`): a function is TRL-style iff it has a parameter named ``completions``
(TRL's keyword), else text-style ``fn(completion, answer)``; ``RewardTerm.style`` overrides it.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from mutual_rl.rewards.guard import (
    DEFAULT_TIMEOUT_S,
    FATAL_FIX,
    RewardCounts,
    RewardError,
    _exc_name,
    _finite_number,
    call_reward,
    check_reward_settings,
    preview,
)
from mutual_rl.rewards.isolation import IsolatedReward, RewardFatal, RewardWorkerError, type_name
from mutual_rl.rewards.reward_values import Refused, as_list

if TYPE_CHECKING:
    from mutual_rl.types import Problem

log = logging.getLogger(__name__)

RESERVED = ("prompts", "completions", "answer")
"""Keywords a TRL-style call always gets; a dataset column may not use these names."""
SIGNATURE = "f(prompts, completions, **columns) -> list[float | None]"


def reward_style(fn: Callable) -> str:
    """``"trl"`` iff ``fn`` has a parameter named ``completions``, else ``"text"`` (module docstring)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature: the classic text style
        return "text"
    return "trl" if "completions" in params else "text"


class GuardedBatchReward:
    """A TRL-style reward under a time limit, with its results checked (module docstring).

    Args:
        fn: ``f(prompts, completions, **columns) -> list[float | None]``.
        name: how errors name it (default: the function's ``__name__``).
        timeout_s: seconds per completion of a call (``None``: no limit).
        errors: ``raise`` (default) or ``skip``.
    """

    def __init__(self, fn: Callable, name: str | None = None, *, timeout_s: float | None = DEFAULT_TIMEOUT_S,
                 errors: str = "raise"):
        check_reward_settings(DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s, errors)
        self.fn = fn
        self.name = name or getattr(fn, "__name__", repr(fn))
        self.__name__ = getattr(fn, "__name__", self.name)
        self.timeout_s, self.errors = timeout_s, errors
        self.counts = RewardCounts()
        self._warned: set[str] = set()
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            params = ()
        self._var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
        self._accepted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        self._required = {p.name for p in params if p.default is p.empty
                          and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}

    def keywords(self, problem: Problem, completions: Sequence[str]) -> dict[str, list]:
        """The keyword lists of one call (module docstring); configuration errors raise ``RewardError``."""
        n = len(completions)
        columns = dict(problem.columns or {})
        clash = sorted(set(columns) & set(RESERVED))
        if clash:
            raise RewardError(f"reward {self.name!r} (TRL-style): the data has column(s) {clash} (prompt "
                              f"{problem.prompt_id}), which would hide the keywords {', '.join(RESERVED)} it gets; "
                              "rename those columns in the data (e.g. Dataset.rename_column).")
        every = {"prompts": [problem.problem] * n, "completions": list(completions), "answer": [problem.answer] * n,
                 **{k: [v] * n for k, v in columns.items()}}
        missing = sorted(self._required - set(every))
        if missing:
            raise RewardError(f"reward {self.name!r} (TRL-style) needs the keyword(s) {missing}, which this data "
                              f"does not have (prompt {problem.prompt_id}); it gets {sorted(every)}: give the data "
                              "such columns, or give those parameters defaults or take **kwargs.")
        return every if self._var_kw else {k: v for k, v in every.items() if k in self._accepted}

    def score_group(self, problem: Problem, completions: Sequence[str], *,
                    where: str = "") -> tuple[list[float | None], str]:
        """``(values, status)``: one value (a float, or ``None`` = not applicable) per completion and ``"ok"``;
        ``"error"``/``"timeout"`` with 0.0 for every completion in skip mode; ``RewardError`` in raise mode."""
        n = len(completions)
        kwargs = self.keywords(problem, completions)
        limit = None if self.timeout_s is None else self.timeout_s * max(n, 1)
        t0 = time.monotonic()
        try:
            value = call_reward(self.fn, (), kwargs, limit, self.name, want=n)
        except TimeoutError:
            return self._fail("timeout", f"did not return within {limit:g} s ({n} completions x "
                              f"{self.timeout_s:g} s)", problem, n, where)
        except RewardFatal as exc:  # never skipped: the reward tried to end its process or left processes behind
            raise RewardError(f"reward {self.name!r} {exc}{f' ({where})' if where else ''} on the {n} completions "
                              f"of prompt {preview(problem.problem)} with answer {preview(problem.answer)}; "
                              f"{exc.fix or FATAL_FIX}.") from exc
        except RewardWorkerError:  # the hand-off failed, not the reward: never blamed on it, never skipped
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of user code becomes one named error
            return self._fail("error", f"raised {_exc_name(exc)}: {exc}", problem, n, where, exc)
        elapsed = time.monotonic() - t0
        if limit is not None and elapsed > limit and not isinstance(self.fn, IsolatedReward):  # as GuardedReward
            return self._fail("timeout", f"returned after {elapsed:.1f} s, past its limit of {limit:g} s (it "
                              "disarmed the time limit, e.g. with its own signal.alarm)", problem, n, where)
        values = as_list(value, n)
        if isinstance(values, Refused):
            return self._fail("error", f"returned {values.text}", problem, n, where)
        out: list[float | None] = []
        for i, v in enumerate(values):
            number = None if v is None else _finite_number(v)
            if v is not None and number is None:
                return self._fail("error", f"returned {_short(v)} ({type_name(v)}) for completion {i} "
                                  f"({preview(completions[i], 80)}), not a finite number or None", problem, n, where)
            out.append(number)
        return out, "ok"

    # ------------------------------------------------------------------------------------------ internals
    def _fail(self, kind: str, what: str, problem: Problem, n: int, where: str, cause: BaseException | None = None):
        counter = "reward_timeouts" if kind == "timeout" else "reward_errors"
        if kind == "timeout":
            fix = f"make the reward faster or raise model.reward_timeout_s (now {self.timeout_s:g} s per completion)"
        else:
            fix = f"fix the reward so that it returns one finite float or None per completion ({SIGNATURE})"
        if self.errors == "raise":
            fix += f", or set model.reward_errors: skip to score such calls 0.0 and count them in <policy>/{counter}"
        at = f" ({where})" if where else ""
        message = (f"reward {self.name!r} {what}{at} on the {n} completions of prompt {preview(problem.problem)} "
                   f"with answer {preview(problem.answer)}; {fix}.")
        if self.errors == "raise":
            raise RewardError(message) from cause
        if kind == "timeout":
            self.counts.timeouts += n
        else:
            self.counts.errors += n
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("%s Each completion scored 0.0 and counted in <policy>/%s (only the first such call is "
                        "logged).", message, counter)
        return [0.0] * n, kind


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


__all__ = ["GuardedBatchReward", "RESERVED", "SIGNATURE", "reward_style"]
