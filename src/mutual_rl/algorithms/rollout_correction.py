"""Rollout correction: the engine that sampled the responses (vLLM in bf16, say) and the trainer that scores them
(float32 master weights) are two slightly different distributions; the samples come from the engine's,
``π_engine``, and the update treats them as the trainer's, ``π_trainer`` (its old log-probs, recomputed). The
token-level importance weight ``w = π_trainer(y_t) / π_engine(y_t) = exp(old_logp − engine_logp)`` weighs them back.

Modes (``algorithm.rollout_correction``), with cap ``C`` (``algorithm.rollout_correction_cap``, default 2.0):

* ``none``: no weight (the mismatch is still measured and logged);
* ``tis``: truncated importance sampling -- each token's behaviour (policy-gradient) term is multiplied by
  ``min(w, C)`` (detached), as TRL's ``vllm_importance_sampling_correction`` (token level) and verl's rollout IS in
  truncate mode define it;
* ``mis``: masked importance sampling -- tokens with ``w > C`` get weight 0 (their behaviour term drops out), the
  others 1, as verl's mask mode (upper threshold only here: no lower bound).

How the weight reaches the behaviour term only (:func:`behaviour_weighted`): the objective receives
``logp·w + (logp·(1 − w)).detach()`` -- the same values (ratios, clipping decisions, statistics unchanged) with the
gradient of each token scaled by ``w``; when the objective also has a KL term, its gradient on the weighted tokens is
restored by a zero-valued compensation (``update/loop.py``). Masked or truncated tokens still count in the loss
normalisers (as TRL's token-level modes do).

The mismatch, per policy and step, over the response tokens whose engine trace and recomputed trainer log-probs both
exist (the policy's own rows, ``old_logp: recompute``): mean and max ``|Δ log p|``, ``KL(engine‖trainer)`` by the k3
estimator ``E_engine[w − 1 − log w]`` (non-negative, unbiased for samples from the engine), the raw weight's mean and
max, and the share of tokens truncated (``tis``) or masked (``mis``) -- the share with ``w > C`` in every mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MODES = ("none", "tis", "mis")


@dataclass(frozen=True)
class RolloutMismatch:
    """The engine-vs-trainer mismatch of one policy's update (logged as ``<policy>/rollout/<name>``)."""

    logp_diff_mean: float
    """Mean ``|log π_trainer − log π_engine|`` over the measured tokens."""
    logp_diff_max: float
    """Largest ``|log π_trainer − log π_engine|`` of a measured token."""
    kl_engine_trainer: float
    """``KL(engine‖trainer)``, k3 estimate ``mean(w − 1 − log w)``."""
    weight_mean: float
    """Mean raw weight ``w = π_trainer / π_engine``."""
    weight_max: float
    """Largest raw weight."""
    over_cap: float
    """Share of the measured tokens with ``w`` above the cap (truncated under ``tis``, masked under ``mis``)."""
    tokens: float
    """Tokens measured."""


def check_mode(mode: str, cap: float) -> None:
    """``ValueError`` naming the field and the fix for a bad mode or cap."""
    if mode not in MODES:
        raise ValueError(f"algorithm.rollout_correction={mode!r} is not one of: {', '.join(MODES)}.")
    if not (isinstance(cap, (int, float)) and cap >= 1.0 and cap == cap and cap != float("inf")):
        raise ValueError(f"algorithm.rollout_correction_cap must be a finite number >= 1 (got {cap!r}): the largest "
                         "token weight π_trainer/π_engine kept (tis) or not masked (mis); 2.0 is TRL's and verl's "
                         "usual value.")


@torch.no_grad()
def correction_weights(trainer_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor, mode: str,
                       cap: float) -> tuple[torch.Tensor, RolloutMismatch | None]:
    """The per-token weights ``[B, T]`` of ``mode`` (1 off ``mask``) and the mismatch over ``mask`` (``None`` when
    no token is measured). Inputs ``[B, T]``; computed in float32."""
    check_mode(mode, cap)
    m = mask.bool()
    log_w = (trainer_logp.float() - engine_logp.float()).masked_fill(~m, 0.0)
    w = log_w.exp()
    if mode == "tis":
        weights = w.clamp(max=cap)
    elif mode == "mis":
        weights = (w <= cap).float()
    else:
        weights = torch.ones_like(w)
    weights = torch.where(m, weights, torch.ones_like(weights))
    n = int(m.sum())
    if n == 0:
        return weights, None
    sel_log_w, sel_w = log_w[m], w[m]
    stats = torch.stack([sel_log_w.abs().mean(), sel_log_w.abs().max(), (sel_w - 1 - sel_log_w).mean(),
                         sel_w.mean(), sel_w.max(), (sel_w > cap).float().mean()]).tolist()  # one device read
    return weights, RolloutMismatch(*stats, tokens=float(n))


def behaviour_weighted(logp: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``logp`` with the same values and each token's gradient scaled by ``weights`` (detached)."""
    w = weights.detach().to(logp.dtype)
    return logp * w + (logp * (1 - w)).detach()
