"""The run's reward: one function, or a weighted list of terms mixing text-style and TRL-style functions.

``model.reward`` is either

* a string: a registered name (``integer_match``, ``math_verify``, ...) or ``package.module:function``; or
* a list of :class:`RewardTerm` ``{fn, weight, name, style}``, e.g. ``[{fn: math_verify, weight: 1.0},
  {fn: boxed_format, weight: 0.2}]``.

Each function is text-style ``fn(completion, answer) -> float``, called once per completion through
:class:`~mutual_rl.rewards.guard.GuardedReward`, or TRL-style ``f(prompts, completions, **columns) ->
list[float | None]``, called once per group through :class:`~mutual_rl.rewards.trl_style.GuardedBatchReward`
(what it is passed, time limits and ``None``: :mod:`mutual_rl.rewards.trl_style`). The style is detected from the
signature (a parameter named ``completions`` means TRL-style) unless ``style`` says it.

A completion's reward is ``sum(weight * value)`` over the terms (a ``None`` value counts 0.0; so does a failed call
in ``reward_errors: skip`` mode, which is counted). GRPO advantages, ``<policy>/reward`` and ``pass_rate`` use that
total. With a list, each term's unweighted mean over the step's rollouts is logged as ``<policy>/reward/<name>``
(a single string logs no per-term metrics: the total is the term).

Where each function runs (``isolation``, ``model.reward_isolation``): ``custom`` (default) calls
``package.module:function`` rewards in a worker process of their own (:mod:`mutual_rl.rewards.isolation`: a
``sys.exit``, a fork, a pool or a ``chdir`` in the reward cannot reach the trainer; a hard kill on timeout) and the
registered rewards in the trainer's process; ``all`` calls the registered ones in a worker too; ``none`` calls every
reward in the trainer's process (a ``SystemExit`` is still a ``RewardError`` and a changed working directory is put
back, but a fork or a pool is not contained). A call in a worker costs one round trip: 0.2-0.5 ms instead of
0.02-0.08 ms in process (5-14x, ``scripts/bench_reward_isolation.py`` on 2 busy CPUs), i.e. 13-27 ms per 64
completions, within the noise of sampling those 64 completions with the smallest preset (~0.2 s on one CPU thread);
the worker starts in ~0.1 s plus the reward module's imports. ``math_verify`` always runs in its own worker
(:mod:`mutual_rl.rewards.verify`). Registered rewards stay in process by default: they are this package's code
(no exit, fork or chdir), and in process they cost 5-14x less per call.

Evaluation: a sample is correct iff the **first** term's value is > 0 (list the accuracy term first; a ``None`` is
not correct); maj@k extracts answers with the first term's rule (:mod:`mutual_rl.evaluation.answers`, by name).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal

from mutual_rl.rewards.base import get_reward
from mutual_rl.rewards.guard import DEFAULT_TIMEOUT_S, GuardedReward, RewardCounts
from mutual_rl.rewards.isolation import IsolatedReward, check_isolation
from mutual_rl.rewards.trl_style import GuardedBatchReward, reward_style

if TYPE_CHECKING:
    from mutual_rl.types import Problem

STYLES = ("auto", "text", "trl")


@dataclass
class RewardTerm:
    """One term of a weighted reward (model.reward as a list)."""

    fn: str
    """Registered reward name or package.module:function, text-style or TRL-style."""
    weight: float = 1.0
    """Factor of this term in the sum (0: logged only; < 0: a penalty)."""
    name: str | None = None
    """Log name, <policy>/reward/<name>; default: fn without a package.module: prefix."""
    style: Literal["auto", "text", "trl"] = "auto"
    """auto: TRL-style iff the function has a parameter named completions."""

    def __post_init__(self) -> None:
        if not isinstance(self.fn, str) or not self.fn.strip():
            raise ValueError(f"RewardTerm.fn must be a reward name or 'package.module:function' (got {self.fn!r}).")
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w):
            raise ValueError(f"RewardTerm.weight of {self.fn!r} must be a finite number (got {w!r}).")
        self.weight = float(w)
        if self.name is not None and (not isinstance(self.name, str) or not self.name.strip()):
            raise ValueError(f"RewardTerm.name of {self.fn!r} must be a non-empty string or null (got {self.name!r}).")
        if self.style not in STYLES:
            raise ValueError(f"RewardTerm.style of {self.fn!r} must be one of {', '.join(STYLES)} "
                             f"(got {self.style!r}).")

    @property
    def log_name(self) -> str:
        return self.name or self.fn.rpartition(":")[2]


@dataclass(frozen=True)
class GroupScore:
    """One group's rewards: ``total`` per completion, each term's unweighted values (``None`` as 0.0), and how many
    completions a failed call scored 0.0 (skip mode)."""

    total: list[float]
    terms: dict[str, list[float]]
    errors: int = 0
    timeouts: int = 0


@dataclass(frozen=True)
class _Term:
    name: str
    weight: float
    scorer: GuardedReward | GuardedBatchReward

    def values(self, problem: Problem, completions: Sequence[str], where: str) -> tuple[list, dict[str, int]]:
        counts = {"error": 0, "timeout": 0}
        if isinstance(self.scorer, GuardedBatchReward):
            values, status = self.scorer.score_group(problem, completions, where=where)
            if status in counts:
                counts[status] += len(completions)
            return values, counts
        out = []
        for c in completions:
            value, status = self.scorer.score(c, problem.answer, where=where)
            out.append(value)
            if status in counts:
                counts[status] += 1
        return out, counts


class Reward:
    """The run's reward (module docstring): ``score_group`` for training, ``correct`` for evaluation.

    Build it with :func:`build_reward` (from ``model.reward``) or :func:`as_reward` (from a function or guard).
    ``__name__`` is the first term's function name (answer extraction picks its rule by it).
    """

    def __init__(self, terms: list[_Term], *, log_terms: bool):
        if not terms:
            raise ValueError("a reward needs at least one term")
        names = [t.name for t in terms]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"model.reward: several terms are named {dupes}; give each a distinct name: (it is "
                             "the <policy>/reward/<name> metric).")
        self.terms, self.log_terms = list(terms), log_terms
        self.__name__ = terms[0].scorer.__name__

    @property
    def names(self) -> list[str]:
        """The terms' log names, in order."""
        return [t.name for t in self.terms]

    @property
    def counts(self) -> RewardCounts:
        """Completions scored 0.0 after a failed call, over all terms since this reward was built."""
        return RewardCounts(errors=sum(t.scorer.counts.errors for t in self.terms),
                            timeouts=sum(t.scorer.counts.timeouts for t in self.terms))

    def close(self) -> None:
        """Kill the worker processes of this reward's isolated terms (a later call starts new ones)."""
        for t in self.terms:
            if isinstance(t.scorer.fn, IsolatedReward):
                t.scorer.fn.close()

    def score_group(self, problem: Problem, completions: Sequence[str], *, where: str = "") -> GroupScore:
        """Every term on one prompt's completions and their weighted sum (module docstring)."""
        total = [0.0] * len(completions)
        terms: dict[str, list[float]] = {}
        errors = timeouts = 0
        for term in self.terms:
            values, counts = term.values(problem, completions, where)
            clean = [0.0 if v is None else float(v) for v in values]
            terms[term.name] = clean
            total = [t + term.weight * v for t, v in zip(total, clean)]
            errors, timeouts = errors + counts["error"], timeouts + counts["timeout"]
        return GroupScore(total, terms, errors, timeouts)

    def correct(self, problem: Problem, completions: Sequence[str], *, where: str = "") -> list[bool]:
        """Per completion: is the first term's value > 0 (``None`` is not)? The evaluation criterion."""
        values, _ = self.terms[0].values(problem, completions, where)
        return [v is not None and v > 0 for v in values]

    def __call__(self, completion: str, answer: str) -> float:
        """The weighted total of one completion; only for rewards whose terms are all text-style."""
        if any(isinstance(t.scorer, GuardedBatchReward) for t in self.terms):
            raise TypeError(f"reward {self.__name__!r} has TRL-style terms, which need the prompt and its columns: "
                            "call score_group(problem, completions) instead of reward(completion, answer).")
        return sum(t.weight * t.scorer.score(completion, answer)[0] for t in self.terms)


def _placed(fn: Callable, spec: str, isolation: str) -> Callable:
    """``fn`` where ``isolation`` runs it (module docstring): wrapped in an :class:`IsolatedReward`, or as is."""
    self_limited = callable(getattr(fn, "with_time_limit", None))  # math_verify: its own worker already
    if self_limited or isolation == "none" or (isolation == "custom" and ":" not in spec):
        return fn
    return IsolatedReward(fn, spec if ":" in spec else None)


def _guard(fn: Callable, name: str, style: str, timeout_s: float | None, errors: str):
    if style == "auto":
        style = reward_style(fn)
    cls = GuardedBatchReward if style == "trl" else GuardedReward
    return cls(fn, name, timeout_s=timeout_s, errors=errors)


def _as_term(item, index: int) -> RewardTerm:
    if isinstance(item, RewardTerm):
        return item
    if isinstance(item, str):
        return RewardTerm(fn=item)
    if isinstance(item, dict):
        unknown = sorted(set(item) - {f.name for f in fields(RewardTerm)})
        if unknown or "fn" not in item:
            raise ValueError(f"model.reward[{index}] = {item!r}: a term has the keys fn (required), weight, name, "
                             f"style{f'; unknown: {unknown}' if unknown else ''}.")
        return RewardTerm(**item)
    raise ValueError(f"model.reward[{index}] = {item!r}: give a term {{fn: ..., weight: ...}} or a reward name.")


def build_reward(spec: str | RewardTerm | Sequence[RewardTerm | dict | str], *,
                 timeout_s: float | None = DEFAULT_TIMEOUT_S, errors: str = "raise",
                 isolation: str = "custom") -> Reward:
    """The :class:`Reward` of ``model.reward`` (module docstring) under the run's time limit, error mode and
    ``isolation`` (``model.reward_isolation``: which functions run in a worker process, module docstring)."""
    check_isolation(isolation)
    if isinstance(spec, str):
        if spec.lstrip().startswith(("[", "{")):
            raise ValueError(f"model.reward {spec!r} looks like a list of terms but is not one: each term is "
                             "{fn: <reward name or package.module:function>, weight: <finite number>, name: <log "
                             "name>, style: auto|text|trl}, e.g. [{fn: math_verify, weight: 1.0}].")
        fn = _placed(get_reward(spec), spec, isolation)
        return Reward([_Term(spec, 1.0, _guard(fn, spec, "auto", timeout_s, errors))], log_terms=False)
    items = [spec] if isinstance(spec, (RewardTerm, dict)) else list(spec)
    if not items:
        raise ValueError("model.reward is an empty list: give a reward name, or terms such as "
                         "[{fn: math_verify, weight: 1.0}, {fn: boxed_format, weight: 0.2}].")
    terms = []
    for i, item in enumerate(items):
        term = _as_term(item, i)
        try:
            fn = get_reward(term.fn)
        except ValueError as exc:
            raise ValueError(f"model.reward[{i}]: {exc}") from None
        fn = _placed(fn, term.fn, isolation)
        terms.append(_Term(term.log_name, term.weight, _guard(fn, term.fn, term.style, timeout_s, errors)))
    if all(t.weight == 0 for t in terms):
        raise ValueError(f"model.reward: every term's weight is 0 ({', '.join(t.name for t in terms)}), so every "
                         "completion scores 0 and nothing trains; give at least one term a non-zero weight.")
    return Reward(terms, log_terms=True)


def as_reward(obj, *, timeout_s: float | None = DEFAULT_TIMEOUT_S, errors: str = "raise") -> Reward:
    """``obj`` as a :class:`Reward`: a ``Reward`` as is; a guard as its single term; a plain function (style
    detected) guarded with ``timeout_s`` and ``errors``."""
    if isinstance(obj, Reward):
        return obj
    if isinstance(obj, (GuardedReward, GuardedBatchReward)):
        return Reward([_Term(obj.name, 1.0, obj)], log_terms=False)
    if callable(obj):
        name = getattr(obj, "__name__", repr(obj))
        return Reward([_Term(name, 1.0, _guard(obj, name, "auto", timeout_s, errors))], log_terms=False)
    raise TypeError(f"expected a reward (a function, a guard or a Reward), got {type(obj).__name__}")
