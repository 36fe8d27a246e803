"""Lockstep for code written as if there were one process: the one helper that regimes, evaluation and rollout
engines use to stay in step with the other processes (``mutual_rl.distributed`` holds the collectives).

Under FSDP across several processes every forward and backward of a sharded policy is a collective, so every rank
must run the same number of them for that policy. Code that loops over data-dependent chunks (generate calls,
forward batches of a regime, greedy-evaluation batches) asks :func:`padded` for its list of chunks: the list comes
back with ``None`` appended for every chunk the busiest rank has beyond this one's, and the caller runs a one-row
dummy pass for each ``None`` (``Policy.dummy_logp`` / a one-prompt ``generate``), discarding its result. Statistics
that must be the same on every rank (HACPO's capability rates) use :func:`sum_over_ranks` / :func:`max_over_ranks`.
In one process, or for a model that is not sharded, every helper is the identity.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import torch

from mutual_rl.distributed import (
    agree_max,
    agree_sum,
    collective_device,
    gather_objects,
    lockstep_needed,
    rank_and_world,
)

T = TypeVar("T")


def in_lockstep(policy) -> bool:
    """Whether ``policy`` (a Policy or its model) is sharded across several processes (its passes are collectives)."""
    return lockstep_needed(getattr(policy, "model", policy))


def padded(policy, chunks: Sequence[T]) -> list[T | None]:
    """``chunks`` followed by ``None`` for each chunk another rank has beyond this one's (one agreement, before
    the first pass; the identity unless :func:`in_lockstep`). Run a discarded dummy pass for every ``None``."""
    out: list[T | None] = list(chunks)
    if in_lockstep(policy):
        out += [None] * (agree_max([len(out)])[0] - len(out))
    return out


def sum_over_ranks(values: Sequence[float]) -> list[float]:
    """Element-wise sum over every process (identity in one process); every rank must call it alike."""
    return agree_sum(values)


def max_over_ranks(values: Sequence[int]) -> list[int]:
    """Element-wise maximum over every process (identity in one process); every rank must call it alike."""
    return agree_max(values)


def gather_from_ranks(obj: T) -> list[T]:
    """``[obj of rank 0, obj of rank 1, ...]`` (``[obj]`` in one process); every rank must call it alike."""
    return gather_objects(obj)


def world_size() -> int:
    """The number of processes of the run (1 without a process group)."""
    return rank_and_world()[1]


def reduction_device() -> torch.device:
    """The device tensors must be on for a reduction over processes (CUDA under NCCL, else CPU)."""
    return collective_device()
