"""MWRA budget planning: pure functions from (policies, last step's outcome statistics) to per-policy budgets.

What is implemented (docs/methods.md §4):

* :class:`Budget` -- one policy's budget for one training step: rollouts per prompt ``n``, ``max_new_tokens``,
  whether it ``update``\\ s this step, and its ``placement`` (which device serves its rollouts; training always
  runs on the trainer's devices, placed by the Lightning strategy).
* :func:`plan_budgets` -- the planner. Two modes:

  ``equal`` (default; matched compute, as the papers compare): the total rollouts per prompt ``T`` is split as
  evenly as possible, ``n_p = floor(T / N)`` plus one for the first ``T mod N`` policies in config order. With
  the default ``T = sum of the policies' configured n`` and equal configured ``n`` this is every policy's own
  ``n``.

  ``adaptive`` *(ours)*: moves rollout budget toward the policies with more all-fail groups while keeping
  ``T`` fixed. Rule, exactly: weight ``w_p = eps + f_p`` with ``f_p`` the policy's all-fail group fraction
  (the last step's, or its exponential moving average, see :func:`update_ema`); extra budget
  ``E = T - N * n_min``; quota ``q_p = E * w_p / sum_q w_q``; ``n_p = n_min + floor(q_p)`` plus one for the
  ``E - sum floor(q_p)`` policies with the largest remainders ``q_p - floor(q_p)`` (ties: config order).
  So ``sum n_p = T`` exactly and every ``n_p >= n_min >= 2`` (a GRPO group needs two rollouts). Before any
  statistics exist (first step) all ``f_p = 0`` and the plan equals the ``equal`` plan.

* Update schedule: policy ``p`` updates at step ``s`` iff ``s % update_every[p] == 0`` (default 1: every
  step). ``update_every = 0`` (never) is rejected: such a policy should be a stored peer (SEE replay).
* Placement: ``"colocate"`` (default: the policy's rollouts run on the trainer's devices) or a non-negative
  device index (``int``) for an engine that serves the policy's rollouts on that device. The planner validates
  it and carries it in every budget; the module hands it to the rollout engine's ``place`` each step. Both
  built-in engines accept only ``"colocate"`` and say so at set-up: the HF engine generates with the training
  weights, and an in-process vLLM engine is bound to its process's device. A device index is for an engine that
  serves rollouts elsewhere (none ships yet). Nothing here names a device string.

:func:`validate_budgets` rejects invalid plans with errors that name the policy and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MODES = ("equal", "adaptive")
COLOCATE = "colocate"


@dataclass(frozen=True)
class Budget:
    """One policy's budget for one step (read by ``MutualRLModule`` each step)."""

    n: int
    """Rollouts per prompt (group size)."""
    max_new_tokens: int
    update: bool = True
    """Whether the policy takes its optimizer steps this step."""
    placement: str | int = COLOCATE
    """``"colocate"`` (trainer's devices) or a device index serving this policy's rollouts (``engine.place``)."""


def validate_placement(name: str, placement, num_devices: int | None = None) -> None:
    if placement == COLOCATE:
        return
    if isinstance(placement, bool) or not isinstance(placement, int) or placement < 0:
        raise ValueError(f"allocation: placement of policy {name!r} is {placement!r}; use {COLOCATE!r} or a "
                         "device index >= 0.")
    if num_devices is not None and placement >= num_devices:
        raise ValueError(f"allocation: policy {name!r} is placed on device {placement}, but only {num_devices} "
                         f"device(s) are visible; use an index < {num_devices} or {COLOCATE!r}.")


def validate_schedule(names: Sequence[str], update_every: Mapping[str, int] | None) -> None:
    """Every policy must update at some step; names must be known."""
    for name, k in (update_every or {}).items():
        if name not in names:
            raise ValueError(f"allocation: update_every names unknown policy {name!r}; policies: {list(names)}.")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"allocation: update_every[{name!r}] = {k!r} means policy {name!r} never updates; use "
                             "an integer >= 1, or replay it as a stored peer (ExperienceExchange replay_policies).")


def apportion(total: int, weights: Sequence[float], minimum: int = 0) -> list[int]:
    """Largest-remainder apportionment of ``total`` over ``weights`` with a floor of ``minimum`` each.

    Returns integers ``n_i >= minimum`` summing to ``total``; ties in the remainder go to the earlier index.
    """
    k = len(weights)
    if k == 0:
        raise ValueError("allocation: no policies to allocate to.")
    extra = total - k * minimum
    if extra < 0:
        raise ValueError(f"allocation: total rollouts per prompt {total} < {k} policies x n_min {minimum}; raise "
                         "the total or lower n_min.")
    if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"allocation: weights must be finite, >= 0 and not all 0 (got {list(weights)}).")
    s = sum(weights)
    quotas = [extra * w / s for w in weights]
    base = [math.floor(q) for q in quotas]
    left = extra - sum(base)
    order = sorted(range(k), key=lambda i: (-(quotas[i] - base[i]), i))
    for i in order[:left]:
        base[i] += 1
    return [minimum + b for b in base]


def update_ema(previous: float | None, value: float, decay: float) -> float:
    """``f <- decay * f + (1 - decay) * value`` (the first value is taken as is); ``decay = 0``: last step."""
    return value if previous is None else decay * previous + (1.0 - decay) * value


def plan_budgets(
    names: Sequence[str],
    max_new_tokens: Mapping[str, int],
    *,
    total: int,
    step: int,
    mode: str = "equal",
    all_fail: Mapping[str, float] | None = None,
    eps: float = 0.05,
    n_min: int = 2,
    update_every: Mapping[str, int] | None = None,
    placement: Mapping[str, str | int] | None = None,
) -> dict[str, Budget]:
    """Budgets of all policies for training step ``step`` (pure; see the module docstring for the rules).

    Args:
        names: the policies, in config order (ties go to the earlier one).
        max_new_tokens: each policy's max new tokens this step.
        total: ``T``, total rollouts per prompt over all policies (conserved by both modes).
        mode: ``equal`` | ``adaptive``.
        all_fail: adaptive only: each policy's all-fail group fraction (last step or EMA); missing = 0.
        eps: adaptive only: weight floor, so a policy with no all-fail groups keeps a share.
        n_min: adaptive only: smallest group size (>= 2).
    """
    names = list(names)
    if len(set(names)) != len(names):
        raise ValueError(f"allocation: policy names must be unique, got {names}.")
    if mode not in MODES:
        raise ValueError(f"allocation: mode {mode!r} is not one of: {', '.join(MODES)}.")
    validate_schedule(names, update_every)
    for name in all_fail or {}:
        if name not in names:
            raise ValueError(f"allocation: statistics for unknown policy {name!r}; policies: {names}.")
    if mode == "equal":
        ns = apportion(total, [1.0] * len(names), 0)
    else:
        if n_min < 2:
            raise ValueError(f"allocation: n_min = {n_min}; a GRPO group needs n_min >= 2.")
        if eps <= 0:
            raise ValueError(f"allocation: eps = {eps} must be > 0 (every policy keeps a share).")
        fails = all_fail or {}
        ns = apportion(total, [eps + min(max(float(fails.get(n, 0.0)), 0.0), 1.0) for n in names], n_min)
    every = update_every or {}
    where = placement or {}
    budgets = {
        name: Budget(n=n, max_new_tokens=int(max_new_tokens[name]), update=step % every.get(name, 1) == 0,
                     placement=where.get(name, COLOCATE))
        for name, n in zip(names, ns)
    }
    validate_budgets(budgets, names, total=total)
    return budgets


def validate_budgets(
    budgets: Mapping[str, Budget], names: Sequence[str], *, total: int | None = None, num_devices: int | None = None,
) -> None:
    """Reject a plan that is not usable: unknown or missing policies, ``n < 1``, ``max_new_tokens < 1``,
    a total that is not conserved, an invalid placement."""
    unknown = sorted(set(budgets) - set(names))
    missing = [n for n in names if n not in budgets]
    if unknown:
        raise ValueError(f"allocation: budgets for unknown policies {unknown}; policies: {list(names)}.")
    if missing:
        raise ValueError(f"allocation: no budget for policies {missing}.")
    for name, b in budgets.items():
        if not isinstance(b.n, int) or b.n < 1:
            raise ValueError(f"allocation: policy {name!r} has n = {b.n!r}; rollouts per prompt must be >= 1.")
        if not isinstance(b.max_new_tokens, int) or b.max_new_tokens < 1:
            raise ValueError(f"allocation: policy {name!r} has max_new_tokens = {b.max_new_tokens!r}; must be >= 1.")
        validate_placement(name, b.placement, num_devices)
    if total is not None and sum(b.n for b in budgets.values()) != total:
        got = {k: b.n for k, b in budgets.items()}
        raise ValueError(f"allocation: rollouts per prompt {got} sum to {sum(got.values())}, not the fixed total "
                         f"{total}; the plan must conserve the total.")
