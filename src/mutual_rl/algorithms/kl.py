"""Per-token KL estimators between the current policy and a reference (pure tensor functions).

Samples are the sampled response tokens; ``logp``, ``ref_logp``: ``[B, T]`` natural-log probs of those tokens
under the current policy and the reference. With ``d = logp − ref_logp`` (Schulman, "Approximating KL
Divergence", 2020):

- ``k1 = d``                       (unbiased for KL(π‖ref), high variance, can be negative)
- ``k2 = ½ d²``                    (biased, low variance, ≥ 0)
- ``k3 = exp(−d) − (−d) − 1``      (unbiased, low variance, ≥ 0; verl's ``low_var_kl``)

Deviation from verl: no clamping of ``d`` or of k3 (verl clamps ``d`` to ±20 and k3 to [−10, 10]); callers
that need it clamp their inputs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["KL_ESTIMATORS", "kl_penalty"]


def _k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp


def _k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logp - ref_logp).square()


def _k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    log_r = ref_logp - logp
    return torch.exp(log_r) - log_r - 1.0


#: Registry: name -> ``fn(logp [B, T], ref_logp [B, T]) -> [B, T]``.
KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": _k1,
    "k2": _k2,
    "k3": _k3,
}


def resolve_kl(kind: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Return the estimator registered as ``kind``; ``ValueError`` listing the choices otherwise."""
    try:
        return KL_ESTIMATORS[kind]
    except KeyError:
        raise ValueError(f"unknown KL estimator {kind!r}; choices: {sorted(KL_ESTIMATORS)}") from None


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` of KL(π_θ ‖ π_ref) from sampled-token log-probs (see module doc)."""
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} differ in shape")
    return resolve_kl(kind)(logp, ref_logp)
