"""GRPO outcome advantages and group outcome statistics (docs/methods.md §1).

Grouping always comes from explicit ``group_ids`` (arbitrary integers, any order, not necessarily contiguous);
it is never inferred from tensor layout. All functions are vectorised (``unique`` + ``index_add``), with no
Python loop over groups.

As implemented, for each group ``g`` with rewards ``R_g`` (``n_g`` responses):

- ``scale="group"``: ``Â_i = (r_i − mean(R_g)) / (std(R_g) + eps)``, ``std`` unbiased (``torch.std``,
  divisor ``n_g − 1``). Identical to verl's ``compute_grpo_outcome_advantage`` for ``n_g ≥ 2``.
- ``scale="none"`` (Dr.GRPO): ``Â_i = r_i − mean(R_g)``.
- Zero-variance groups (all rewards equal, tested exactly with min == max) get ``Â = 0`` exactly.
- Deviation from verl: a group of size 1 gets ``Â = 0`` (verl returns ``r / (1 + eps)``; with one response
  there is no relative signal, so we give none).

Statistics are accumulated in float64 and the result is cast back to the rewards' floating dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["ADVANTAGE_SCALES", "grpo_advantages", "group_success_counts", "group_outcome_stats"]


def _group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``group_ids [N]`` -> (unique ids ``[G]``, inverse ``[N]`` in ``0..G-1``, ``G``)."""
    if group_ids.dim() != 1:
        raise ValueError(f"group_ids must be 1-D [N], got shape {tuple(group_ids.shape)}")
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    uniq, inv = torch.unique(group_ids, return_inverse=True)
    return uniq, inv, int(uniq.numel())


def _scale_group(centered: torch.Tensor, std: torch.Tensor, eps: float) -> torch.Tensor:
    return centered / (std + eps)


def _scale_none(centered: torch.Tensor, std: torch.Tensor, eps: float) -> torch.Tensor:
    return centered


#: Registry: name -> ``fn(centered [N], std_per_response [N], eps) -> [N]``.
ADVANTAGE_SCALES: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "group": _scale_group,
    "none": _scale_none,
}


def grpo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6, scale: str = "group"
) -> torch.Tensor:
    """GRPO advantages ``[N]`` from scalar ``rewards [N]`` and integer ``group_ids [N]`` (see module doc).

    ``scale``: ``"group"`` (divide by ``std + eps``) or ``"none"`` (Dr.GRPO, centring only).
    Raises ``ValueError`` on an unknown ``scale`` (listing the choices) or mismatched shapes.
    """
    try:
        scale_fn = ADVANTAGE_SCALES[scale]
    except KeyError:
        raise ValueError(f"unknown advantage scale {scale!r}; choices: {sorted(ADVANTAGE_SCALES)}") from None
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must both be [N]"
        )
    out_dtype = rewards.dtype if rewards.dtype.is_floating_point else torch.get_default_dtype()
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=out_dtype, device=rewards.device)
    _, inv, g = _group_index(group_ids)
    r = rewards.detach().to(torch.float64)
    zeros = torch.zeros(g, dtype=torch.float64, device=r.device)
    count = zeros.index_add(0, inv, torch.ones_like(r))
    mean = zeros.index_add(0, inv, r) / count
    centered = r - mean[inv]
    sq = zeros.index_add(0, inv, centered.square())
    std = torch.sqrt(sq / (count - 1).clamp(min=1.0))
    gmax = torch.full((g,), float("-inf"), dtype=torch.float64, device=r.device)
    gmax = gmax.scatter_reduce(0, inv, r, reduce="amax")
    gmin = torch.full((g,), float("inf"), dtype=torch.float64, device=r.device)
    gmin = gmin.scatter_reduce(0, inv, r, reduce="amin")
    degenerate = (gmax == gmin) | (count < 2)  # zero variance or size 1 -> no signal
    adv = scale_fn(centered, std[inv], eps)
    adv = torch.where(degenerate[inv], torch.zeros_like(adv), adv)
    return adv.to(out_dtype)


def group_success_counts(
    rewards: torch.Tensor, group_ids: torch.Tensor, success_threshold: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per group: (unique ids ``[G]`` sorted, successes ``k [G]`` = #{r > threshold}, sizes ``n [G]``)."""
    uniq, inv, g = _group_index(group_ids)
    zeros = torch.zeros(g, dtype=torch.long, device=rewards.device)
    k = zeros.index_add(0, inv, (rewards > success_threshold).long())
    n = zeros.index_add(0, inv, torch.ones_like(inv))
    return uniq, k, n


def group_outcome_stats(
    rewards: torch.Tensor, group_ids: torch.Tensor, success_threshold: float = 0.0
) -> dict[str, float]:
    """Group outcome fractions for logging; a success is ``r > success_threshold``.

    Returns ``{"num_groups", "all_fail_frac", "all_pass_frac", "mixed_frac", "pass_rate", "reward_mean"}``:
    fractions of groups with ``k = 0`` / ``k = n`` / ``0 < k < n``, the fraction of responses that succeed,
    and the mean reward (python floats; all 0.0 when there are no responses).
    """
    if rewards.numel() == 0:
        keys = ("all_fail_frac", "all_pass_frac", "mixed_frac", "pass_rate", "reward_mean")
        return {"num_groups": 0.0, **dict.fromkeys(keys, 0.0)}
    _, k, n = group_success_counts(rewards, group_ids, success_threshold)
    g = float(k.numel())
    all_fail = float((k == 0).sum()) / g
    all_pass = float((k == n).sum()) / g
    return {
        "num_groups": g,
        "all_fail_frac": all_fail,
        "all_pass_frac": all_pass,
        "mixed_frac": float(((k > 0) & (k < n)).sum()) / g,
        "pass_rate": float(k.sum()) / float(n.sum()),
        "reward_mean": float(rewards.double().mean()),
    }
