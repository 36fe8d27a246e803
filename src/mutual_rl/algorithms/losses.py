"""DAPO clipped policy-gradient loss with optional dual clip and KL penalty (docs/methods.md §1).

Shapes: ``B`` sequences, ``T`` token positions; ``mask [B, T]`` is 1 on response tokens.

As implemented, per token (``Â`` broadcast from the sequence's advantage):

- ``ρ_t = exp(clamp(logp_t − old_logp_t, −20, 20))`` (the clamp only guards overflow, as in verl);
- ``ℓ_t = −min(ρ_t Â, clip(ρ_t, 1 − clip_low, 1 + clip_high) Â)``  (asymmetric "clip-higher", DAPO);
- dual clip ``c > 1`` (verl / Ye et al. 2020), only where ``Â < 0``: ``ℓ_t = min(ℓ_t, −c Â)``;
- KL (off by default, ``kl_coef = β = 0``): ``ℓ_t += β · kl_penalty(logp, ref_logp, kl_kind)_t``;
- per-sequence ``weights [B]`` multiply every token loss of their sequence (the KL term included);
- the total is ``aggregate(ℓ, mask, agg, max_len, token_count, num_seqs)`` (see ``aggregation.py`` for the
  global normalisers that make micro-batches sum to the mini-batch loss).

Skipping zero-advantage responses (docs/methods.md §1, "Skipping zero-advantage rows"): with ``β = 0`` and
no other loss term on them, a response with ``Â = 0`` has ``ℓ_t = 0`` and zero gradient. Drop the rows marked by
``zero_advantage_skip_mask`` from the forward/backward, and pass ``token_count`` / ``num_seqs`` computed on the
*whole* mini-batch (skipped rows included): the loss value and the gradient are unchanged.
"""

from __future__ import annotations

import torch

from mutual_rl.algorithms.aggregation import aggregate, resolve_aggregation
from mutual_rl.algorithms.kl import kl_penalty, resolve_kl
from mutual_rl.algorithms.masking import masked_mean

__all__ = ["policy_loss", "zero_advantage_skip_mask"]

_LOG_RATIO_CLAMP = 20.0


def zero_advantage_skip_mask(
    advantages: torch.Tensor, kl_coef: float = 0.0, extra_loss: bool = False
) -> torch.Tensor:
    """Bool ``[B]``: True for sequences whose forward/backward can be skipped without changing any gradient.

    A row is skippable iff ``advantages == 0`` and no other term touches it (``kl_coef == 0`` and not
    ``extra_loss``, e.g. an entropy bonus or an SGT NLL term). If a KL or extra term is on, nothing is skipped.
    The caller must still count skipped rows in ``token_count`` / ``num_seqs`` when calling ``policy_loss``.
    """
    if kl_coef != 0.0 or extra_loss:
        return torch.zeros_like(advantages, dtype=torch.bool)
    return advantages == 0


def check_clip_args(clip_low: float, clip_high: float, dual_clip: float | None, kl_coef: float, ref_logp) -> None:
    """One error for bad clip bounds, a dual clip <= 1, or a KL coefficient without reference log-probs."""
    if not 0.0 <= clip_low < 1.0 or clip_high < 0.0:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    if kl_coef != 0.0 and ref_logp is None:
        raise ValueError("kl_coef != 0 needs ref_logp")


def _check_shapes(logp, old_logp, mask, advantages, weights) -> None:
    """``logp``, ``old_logp``, ``mask``: ``[B, T]``; ``advantages`` and ``weights`` (optional): ``[B]``."""
    if logp.dim() != 2 or logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(
            f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, mask {tuple(mask.shape)} must be [B, T]"
        )
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be [B]={logp.shape[0]}, got {tuple(advantages.shape)}")
    if weights is not None and weights.shape != logp.shape[:1]:
        raise ValueError(f"weights must be [B]={logp.shape[0]}, got {tuple(weights.shape)}")


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    agg: str = "token-mean",
    weights: torch.Tensor | None = None,
    dual_clip: float | None = None,
    max_len: int | None = None,
    token_count: float | int | torch.Tensor | None = None,
    num_seqs: float | int | torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: str = "k3",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DAPO surrogate loss (see module doc). Returns ``(loss, metrics)``.

    Args: ``logp``, ``old_logp``, ``mask``: ``[B, T]``; ``advantages``: ``[B]``; ``weights``: ``[B]`` or None;
    ``ref_logp``: ``[B, T]``, required iff ``kl_coef != 0``.

    ``metrics`` (detached 0-d tensors, token fractions/means over this call's masked tokens):
    ``pg_loss`` (surrogate part, aggregated), ``clip_frac_low`` (``Â < 0`` and ``ρ < 1 − clip_low``: the
    clipped branch is active on the low side, no gradient), ``clip_frac_high`` (``Â > 0`` and
    ``ρ > 1 + clip_high``), ``clip_frac_dual`` (``Â < 0`` and ``ρ > c``; 0 when off), ``approx_kl`` (mean of
    k3 to the old policy, ``ρ − 1 − log ρ`` = ``kl_penalty(old_logp, logp, "k3")``, which estimates
    KL(π_old ‖ π_θ) on tokens sampled from π_old), ``ratio_mean``, ``num_tokens`` (this call's masked count);
    plus ``kl`` (mean per-token KL to the reference) and ``kl_loss`` (aggregated, before β) when ``ref_logp``
    is given.
    """
    resolve_aggregation(agg)
    resolve_kl(kl_kind)
    _check_shapes(logp, old_logp, mask, advantages, weights)
    check_clip_args(clip_low, clip_high, dual_clip, kl_coef, ref_logp)

    m = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(-1)  # [B, 1]
    log_ratio = (logp - old_logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)  # [B, T]
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    loss_mat = torch.maximum(-adv * ratio, -adv * ratio.clamp(lo, hi))  # [B, T]
    neg = adv < 0
    if dual_clip is not None:
        loss_mat = torch.where(neg, torch.minimum(loss_mat, -adv * dual_clip), loss_mat)
    pg_mat = loss_mat
    kl_mat = None
    if ref_logp is not None:
        kl_mat = kl_penalty(logp, ref_logp, kl_kind)
        if kl_coef != 0.0:
            loss_mat = loss_mat + kl_coef * kl_mat
    if weights is not None:
        w = weights.to(logp.dtype).unsqueeze(-1)
        loss_mat, pg_mat = loss_mat * w, pg_mat * w
    loss = aggregate(loss_mat, m, agg, max_len=max_len, token_count=token_count, num_seqs=num_seqs)

    with torch.no_grad():
        r = ratio.detach()
        metrics = {
            "pg_loss": aggregate(pg_mat.detach(), m, agg, max_len, token_count, num_seqs),
            "clip_frac_low": masked_mean((neg & (r < lo)).to(logp.dtype), m),
            "clip_frac_high": masked_mean(((adv > 0) & (r > hi)).to(logp.dtype), m),
            "clip_frac_dual": masked_mean((neg & (r > dual_clip)).to(logp.dtype), m)
            if dual_clip is not None
            else torch.zeros((), dtype=logp.dtype, device=logp.device),
            "approx_kl": masked_mean(kl_penalty(old_logp.detach(), logp.detach(), "k3"), m),
            "ratio_mean": masked_mean(r, m),
            "num_tokens": m.sum(),
        }
        if kl_mat is not None:
            metrics["kl"] = masked_mean(kl_mat.detach(), m)
            metrics["kl_loss"] = aggregate(kl_mat.detach(), m, agg, max_len, token_count, num_seqs)
    return loss, metrics
