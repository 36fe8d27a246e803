"""Resuming: policies matched by name, the configured optimizer settings applied, sampling streams put back.

Functions of the checkpoint dict, the config and the process's random generators, called from the module's
checkpoint hooks (the streams themselves are taken and put back by ``rng.py``).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from mutual_rl.distributed import gather_objects
from mutual_rl.model.spec import PolicySpec
from mutual_rl.rng import rng_state
from mutual_rl.update.schedule import is_scheduled


def apply_optimizer_settings(spec: PolicySpec, optimizer: torch.optim.Optimizer, note: Callable[[str], None]) -> None:
    """After an optimizer state is loaded: the configured settings of ``spec.optimizer`` replace the checkpoint's
    in every param group, with a ``note`` per changed setting (policy, setting, old -> new). A scheduled ``lr`` is
    left alone: the next step sets its own."""
    o = spec.optimizer
    wanted = {"lr": o.lr, "betas": tuple(o.betas), "weight_decay": o.weight_decay, "eps": o.eps}
    if is_scheduled(o):  # a warm-up or decay sets the step's lr before each update (update/schedule.py)
        del wanted["lr"]
    for key, new in wanted.items():
        olds = {tuple(g[key]) if key == "betas" else g[key] for g in optimizer.param_groups}
        if olds != {new}:
            old = ", ".join(map(str, sorted(olds)))
            note(f"Resume: policy {spec.name!r} optimizer.{key} {old} -> {new} (from the config; the checkpoint's "
                 "optimizer state is kept).")
            for g in optimizer.param_groups:
                g[key] = new


def match_policies_by_name(checkpoint: dict, saved: list[str], current: list[str], label: str,
                           strategy_loads_by_position: str | None) -> None:
    """Check the checkpoint's policy names against ``model.policies`` and put ``checkpoint["optimizer_states"]`` in
    ``current`` order. ``strategy_loads_by_position``: the name of a strategy that has already restored the
    optimizer states by position (FSDP restores after set-up), which makes a reorder an error instead."""
    if sorted(saved) != sorted(current):
        only_ckpt = [n for n in saved if n not in current]
        only_cfg = [n for n in current if n not in saved]
        raise ValueError(
            f"checkpoint {label} holds policies {saved} but model.policies lists {current} (only in the checkpoint: "
            f"{only_ckpt}; only in the config: {only_cfg}). Policies are matched by name on resume: list the "
            "checkpoint's policy names (any order), or start a new run without ckpt_path."
        )
    if saved == current:
        return
    # checked before looking at optimizer_states: a sharded checkpoint has none here, FSDP loaded them already
    if strategy_loads_by_position is not None:
        raise ValueError(
            f"checkpoint {label} lists policies {saved}, model.policies lists {current}: with "
            f"{strategy_loads_by_position} optimizer states are restored by position, so list model.policies in the "
            f"checkpoint's order {saved}."
        )
    states = checkpoint.get("optimizer_states")
    if not states:
        return
    if len(states) != len(saved):
        raise ValueError(f"checkpoint {label} holds {len(states)} optimizer states for policies {saved}: it was "
                         "not written by this version of mutual-rl; resume without reordering.")
    by_name = dict(zip(saved, states))
    checkpoint["optimizer_states"] = [by_name[name] for name in current]


def rng_to_restore(state: dict, rank: int, world: int) -> tuple[dict | None, bool]:
    """The stream this rank resumes from a checkpoint's mutual-rl state, and whether ranks must then be offset: each
    rank its own when the world size is the same, else rank 0's, offset per rank."""
    per_rank = state.get("rng_per_rank") or [state.get("rng")]
    if len(per_rank) == world:
        return per_rank[rank], False
    return per_rank[0], world > 1


def offset_rng_per_rank(rank: int, world: int) -> None:
    """Several processes: ``seed_everything`` seeds every rank alike, but ranks sample their own prompts with their
    own streams, so each rank reseeds from its stream plus an offset of its rank (nothing in one process)."""
    if world > 1:
        seed = int(torch.randint(0, 2**62, (1,)).item()) + 1_000_003 * rank
        torch.manual_seed(seed)
        random.seed(seed)


def run_state(specs, policies, regimes) -> dict:
    """What a checkpoint keeps beyond Lightning's (``checkpoint["mutual_rl"]``): the sampling streams (this rank's
    and every rank's), the policies' order (that of ``checkpoint["optimizer_states"]``), their versions and the
    regimes' states."""
    rng = rng_state()
    return {"rng": rng, "rng_per_rank": gather_objects(rng), "policies": [spec.name for spec in specs],
            "versions": {name: p.version for name, p in policies.items()},
            "regimes": {name: r.state_dict() for name, r in regimes.items()}}


def restore_versions_and_regimes(state: dict, policies, regimes) -> None:
    """The policies' versions and the regimes' states of :func:`run_state`, for the policies of this run."""
    for name, v in state.get("versions", {}).items():
        if name in policies:
            policies[name].version = v
    for name, r_state in state.get("regimes", {}).items():
        if name in regimes:
            regimes[name].load_state_dict(r_state)
