"""Reward registry: one signature, names resolved once (docs/design.md, rules 2 and 12).

A reward function takes text and returns a float::

    fn(completion: str, answer: str) -> float

``completion`` is the policy's generated text (without the prompt), ``answer`` the gold answer string of the
prompt. The verifiable rewards shipped here are binary (0.0 or 1.0). Functions that can say *why* they gave a
score have a ``*_with_info`` twin returning :class:`RewardResult`; the registry holds the float functions.

The registry (and ``package.module:function``) also takes TRL-style functions ``f(prompts, completions, **columns)
-> list[float | None]``, told apart by their signature (:mod:`mutual_rl.rewards.trl_style`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

RewardFn = Callable[[str, str], float]

_REGISTRY: dict[str, RewardFn] = {}


@dataclass(frozen=True)
class RewardResult:
    """A reward value plus a short note on how it was reached.

    ``info`` is ``""`` for an ordinary verdict, otherwise a short reason such as ``"no answer found"``,
    ``"timeout"`` or ``"error: ..."``.
    """

    value: float
    info: str = ""


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering ``fn(completion, answer) -> float`` under ``name``; duplicate names raise."""

    def decorator(fn: RewardFn) -> RewardFn:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"reward {name!r} is already registered (by {_REGISTRY[name]!r})")
        _REGISTRY[name] = fn
        return fn

    return decorator


def available_rewards() -> list[str]:
    """Sorted names of the registered rewards."""
    return sorted(_REGISTRY)


def get_reward(name: str) -> RewardFn:
    """The reward function registered as ``name``, or ``"package.module:function"`` (your own
    ``fn(completion, answer) -> float``, importable in every process); an unknown name raises ``ValueError``
    listing the choices."""
    if ":" in name:
        import importlib

        module_name, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"reward {name!r}: cannot import {attr!r} from {module_name!r} ({e}); give "
                             "'package.module:function' importable from the working directory, or one of: "
                             f"{', '.join(available_rewards())}") from None
        if not callable(fn):
            raise ValueError(f"reward {name!r} is not callable; give a function fn(completion, answer) -> float "
                             "or f(prompts, completions, **columns) -> list[float | None].")
        return fn
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown reward {name!r}; choose one of: {', '.join(available_rewards())} (or 'package.module:function')"
        ) from None


def score(fn: RewardFn, completions: Sequence[str], answers: Sequence[str]) -> list[float]:
    """``[fn(c, a) for c, a in zip(completions, answers)]``; the two sequences must have equal length."""
    if len(completions) != len(answers):
        raise ValueError(f"score: {len(completions)} completions but {len(answers)} answers")
    return [float(fn(c, a)) for c, a in zip(completions, answers)]
