"""Per-policy learning-rate schedule: linear warm-up, then constant, cosine or linear decay.

The schedule is a pure function of the training step (one rollout-and-update iteration, as ``trainer.max_steps``
counts them; verl steps its scheduler at the same granularity), not of optimizer steps: a step with
``num_mini_batches`` updates uses one learning rate for all of them. Being a function of the step, it needs no
state of its own in a checkpoint; a resumed run continues the curve where it stopped.

With peak ``lr``, ``W = warmup_steps``, decay end ``D = decay_steps`` (default ``trainer.max_steps``), floor
``f = min_lr_ratio`` and ``p = clamp((s - W) / (D - W), 0, 1)``, step ``s`` (0-based) trains at::

    s < W:      lr * (s + 1) / W                  (the first step already learns; step W - 1 is at lr)
    constant:   lr
    linear:     lr * (f + (1 - f) * (1 - p))
    cosine:     lr * (f + (1 - f) * (1 + cos(pi * p)) / 2)

Unlike the Hugging Face schedulers, warm-up never trains a step at learning rate 0 (they start at ``0 / W``).
"""

from __future__ import annotations

import math

import torch

from mutual_rl.model.spec import OptimizerSpec


def needs_decay_end(o: OptimizerSpec) -> bool:
    """True iff the schedule decays (cosine or linear): it needs ``decay_steps`` or a finite ``max_steps``."""
    return o.schedule != "constant"


def is_scheduled(o: OptimizerSpec) -> bool:
    """True iff the learning rate changes over the run (a warm-up or a decay)."""
    return o.warmup_steps > 0 or o.schedule != "constant"


def decay_end(o: OptimizerSpec, max_steps: int | None, policy: str) -> int | None:
    """``decay_steps``, else ``max_steps`` for a decaying schedule; an error when neither is known."""
    if not needs_decay_end(o):
        return None
    end = o.decay_steps if o.decay_steps is not None else (max_steps if max_steps and max_steps > 0 else None)
    if end is None:
        raise ValueError(f"policy {policy!r}: optimizer.schedule {o.schedule!r} decays until optimizer.decay_steps, "
                         "which is not set, and trainer.max_steps is unbounded: set one of them.")
    if end <= o.warmup_steps:
        raise ValueError(f"policy {policy!r}: the {o.schedule} decay ends at step {end} (optimizer.decay_steps or "
                         f"trainer.max_steps), not after optimizer.warmup_steps = {o.warmup_steps}: lower the "
                         "warm-up or raise the decay end.")
    return end


def lr_factor(o: OptimizerSpec, step: int, end: int | None) -> float:
    """The multiplier of ``o.lr`` at training step ``step`` (module docstring); ``end`` from :func:`decay_end`."""
    if step < o.warmup_steps:
        return (step + 1) / o.warmup_steps
    if o.schedule == "constant":
        return 1.0
    p = min(max((step - o.warmup_steps) / (end - o.warmup_steps), 0.0), 1.0)
    shape = (1.0 - p) if o.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))
    return o.min_lr_ratio + (1.0 - o.min_lr_ratio) * shape


def set_lr(optimizer: torch.optim.Optimizer, o: OptimizerSpec, step: int, end: int | None) -> float:
    """Put the scheduled learning rate of ``step`` into every param group of ``optimizer``; returns it."""
    lr = o.lr * lr_factor(o, step, end)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr
