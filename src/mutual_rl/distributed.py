"""Multi-process helpers: the one place that knows about process groups and their devices (docs/design.md, rules 10 and 14).

Why lockstep matters: under FSDP every forward (and backward) of a sharded policy is a collective -- each FSDP
unit all-gathers its parameters -- so every rank must run the *same number* of forwards and backwards per policy,
in the same order, or the run hangs. With per-rank prompts (``PromptDataModule``) the data-dependent counts differ
between ranks: responses stop at different lengths, a regime admits different numbers of peer rows, zero-advantage
rows are skipped. The code that loops over data-dependent chunks therefore agrees on the largest count first
(:func:`agree_max`) and runs the missing iterations as *dummy* passes (a real one-row pass whose result is
discarded / whose loss is multiplied by 0). Without a process group (one process) all helpers are identities and
nothing is padded.

``lockstep_needed(module)``: lockstep is only needed when ``module`` is sharded by FSDP and more than one process
runs; DDP-style replicas synchronise only gradients, which ``MutualFSDPStrategy`` is the supported path for.
Code written as if there were one process (the update loop, the step's scoring of what regimes request, greedy
evaluation, the HF engine) asks :func:`padded` for its list of chunks: the list comes back with ``None`` appended
for every chunk the busiest rank has beyond this one's, and the caller runs a one-row dummy pass for each ``None``
(``Policy.dummy_logp`` / a one-prompt ``generate``), discarding its result. Regimes never come here: what they need
from the other processes they request, and the step computes it (``mutual_rl.step.scoring``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import torch
from torch import nn

T = TypeVar("T")


def is_distributed() -> bool:
    """A default process group with more than one process exists."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_and_world() -> tuple[int, int]:
    """(global rank, world size) of this process; (0, 1) without a process group."""
    if not is_distributed():
        return 0, 1
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def destroy_process_group() -> None:
    """Destroy the default process group, if one exists (idempotent).

    A process that exits with a gloo group alive can abort at interpreter shutdown ("terminate called without an
    active exception", SIGABRT after a successful run: pytorch/pytorch#190489), because gloo's worker threads are
    torn down after Python. ``MutualFSDPStrategy`` registers this at exit and ``mutual-rl`` calls it when a run ends.
    """
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def collective_device() -> torch.device:
    """The device collectives of the default group need: the current CUDA device for NCCL, else CPU (gloo)."""
    if is_distributed() and torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def is_sharded(module: nn.Module) -> bool:
    """Some submodule of ``module`` is wrapped by FSDP."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return any(isinstance(m, FullyShardedDataParallel) for m in module.modules())


def compute_device(module: nn.Module) -> torch.device:
    """The device ``module``'s forwards compute on: the ``compute_device`` of its outermost FSDP unit (with
    ``cpu_offload`` the parameters wait on the CPU between forwards), else the device of its parameters."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    unit = next((m for m in module.modules() if isinstance(m, FullyShardedDataParallel)), None)
    if unit is not None and unit.compute_device is not None:
        return unit.compute_device
    return next(module.parameters()).device


def lockstep_needed(module: nn.Module) -> bool:
    """True when ``module`` (a policy's model) is FSDP-sharded across more than one process."""
    return is_distributed() and is_sharded(module)


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


def agree_max(values: Sequence[int]) -> list[int]:
    """Element-wise maximum of ``values`` over all ranks (one all-reduce; identity in one process).

    Every rank must pass a sequence of the same length.
    """
    values = [int(v) for v in values]
    if not is_distributed() or not values:
        return values
    t = torch.tensor(values, dtype=torch.long, device=collective_device())
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]


def agree_sum(values: Sequence[float]) -> list[float]:
    """Element-wise sum of ``values`` over all ranks in float64 (one all-reduce; identity in one process)."""
    values = [float(v) for v in values]
    if not is_distributed() or not values:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=collective_device())
    torch.distributed.all_reduce(t)
    return [float(v) for v in t.tolist()]


def raise_together(error: BaseException | None, what: str) -> None:
    """Several processes: if ``what`` failed on any rank, every rank raises (the failing one its own ``error``, the
    others a ``RuntimeError`` pointing to it), instead of the others waiting forever in the next collective. One
    all-reduce; in one process it just re-raises ``error``."""
    failed = agree_max([int(error is not None)])[0] if is_distributed() else int(error is not None)
    if error is not None:
        raise error
    if failed:
        raise RuntimeError(f"{what} failed on another rank (see its error above); stopping this rank too.")


def call_together(fn, what: str):
    """``fn()``; under several processes an exception on any rank raises on every rank (:func:`raise_together`), so
    no rank is left waiting in the next collective."""
    result, error = None, None
    try:
        result = fn()
    except Exception as e:  # noqa: BLE001 - re-raised on this rank, reported to the others
        error = e
    raise_together(error, what)
    return result


def gather_objects(obj) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` (``[obj]`` in one process)."""
    if not is_distributed():
        return [obj]
    gathered: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, obj)
    return gathered


def gather_to_zero(obj) -> list | None:
    """``[obj of rank 0, obj of rank 1, ...]`` on rank 0, ``None`` elsewhere (``[obj]`` in one process)."""
    if not is_distributed():
        return [obj]
    rank = torch.distributed.get_rank()
    gathered: list | None = [None] * torch.distributed.get_world_size() if rank == 0 else None
    torch.distributed.gather_object(obj, gathered, dst=0)
    return gathered


def rank_part(items: Sequence, rank: int, world_size: int) -> list:
    """Rank ``rank``'s contiguous part of ``items`` split into ``world_size`` near-equal parts (sizes differ by at
    most one; the first ``len % world_size`` parts are one longer). Parts may be empty."""
    n, k = len(items), world_size
    start = rank * (n // k) + min(rank, n % k)
    return list(items[start : start + n // k + (1 if rank < n % k else 0)])
