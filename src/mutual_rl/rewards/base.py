"""Reward registry: one signature, names resolved once (docs/design.md, rules 2 and 12).

A reward function takes text and returns a float::

    fn(completion: str, answer: str) -> float

``completion`` is the policy's generated text (without the prompt), ``answer`` the gold answer string of the
prompt. The verifiable rewards shipped here are binary (0.0 or 1.0). Functions that can say *why* they gave a
score have a ``*_with_info`` twin returning :class:`RewardResult`; the registry holds the float functions.

``model.reward`` may also be ``"package.module:function"``, a Python function of your own (:func:`get_reward` says
how the module is found and what is refused); in a run it is called in a worker process
(:mod:`mutual_rl.rewards.isolation`, ``model.reward_isolation``).

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


SIGNATURE = "def f(completion: str, answer: str) -> float (or TRL-style f(prompts, completions, **columns) -> " \
            "list[float | None])"


def get_reward(name: str) -> RewardFn:
    """The reward function registered as ``name``, or ``"package.module:function"`` (module docstring); an unknown
    name raises ``ValueError`` listing the choices.

    ``package.module`` is imported as ``python -m`` would find it: an installed module or one on ``sys.path``
    (``PYTHONPATH``) first, else a file ``package/module.py`` (or ``module.py``) under the working directory, which is
    then appended to ``sys.path`` (so that the reward's worker process and the reward's own imports find it too;
    the console script ``mutual-rl`` does not put the working directory on ``sys.path`` by itself).
    ``function`` must be a Python function (``def`` or ``lambda``) that is not part of Python's standard library:
    ``os:system``, a class, an instance or a module attribute that is not a function is refused with one error.
    """
    if ":" in name:
        return _import_reward(name)
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown reward {name!r}; choose one of: {', '.join(available_rewards())} (or 'package.module:function')"
        ) from None


def _import_reward(name: str) -> RewardFn:
    import importlib
    import inspect
    import os
    import sys

    module_name, _, attr = name.partition(":")
    cwd = os.getcwd()
    try:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            top = module_name.partition(".")[0]
            in_cwd = (os.path.isfile(os.path.join(cwd, top + ".py"))
                      or os.path.isfile(os.path.join(cwd, top, "__init__.py"))
                      or (module_name != top and os.path.isdir(os.path.join(cwd, top))))
            if e.name != top or not in_cwd or cwd in sys.path:
                raise
            sys.path.append(cwd)  # as `python -m` would find it (installed modules first: appended, not prepended)
            importlib.invalidate_caches()
            module = importlib.import_module(module_name)
        fn = getattr(module, attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"reward {name!r}: cannot import {attr!r} from {module_name!r} ({e}); give "
                         "'package.module:function' where package/module.py is a file under the working directory "
                         f"({cwd}) or on PYTHONPATH, or an installed module; or one of: "
                         f"{', '.join(available_rewards())}") from None
    top = (getattr(fn, "__module__", None) or module_name).partition(".")[0]
    if not inspect.isfunction(fn):
        kind = ("a built-in function" if inspect.isbuiltin(fn) else "a class" if inspect.isclass(fn)
                else "a module" if inspect.ismodule(fn) else f"a {type(fn).__name__}")
        raise ValueError(f"reward {name!r} is {kind}, not a Python function; give a function of your own: {SIGNATURE}.")
    if top in sys.stdlib_module_names or top == "builtins":
        raise ValueError(f"reward {name!r} is a function of Python's standard library ({fn.__module__}), not a "
                         f"reward; give a function of your own: {SIGNATURE}.")
    return fn


def score(fn: RewardFn, completions: Sequence[str], answers: Sequence[str]) -> list[float]:
    """``[fn(c, a) for c, a in zip(completions, answers)]``; the two sequences must have equal length."""
    if len(completions) != len(answers):
        raise ValueError(f"score: {len(completions)} completions but {len(answers)} answers")
    return [float(fn(c, a)) for c, a in zip(completions, answers)]
