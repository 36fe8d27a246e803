"""F-TIS: Filtered Truncated Importance Sampling for a peer's samples (docs/methods.md §5.7; Blagoev et al. 2026,
arXiv 2605.22537). Pure tensor functions.

Shapes: ``B`` peer sequences, ``T`` token positions; ``mask [B, T]`` is 1 on response tokens. Three log-probs per
token of a peer sample, kept apart (docs/design.md, rule 3): ``logp`` (the receiver now), ``old_logp`` (the
receiver before this step's update, ``π_R,old``) and ``gen_logp`` (the generator's trace, ``π_gen``; across
vocabularies the THL-aligned trace).

As implemented:

- **Truncated importance weight** (:func:`tis_weights`), per token:
  ``w_t = min(exp(clamp(old_logp_t − gen_logp_t, ±20)), C)``, i.e. ``min(π_R,old / π_gen, C)``. It is computed
  from the receiver's log-probs *before* the update, so it is a constant of the step (stop-gradient).
- **Filter** (:func:`sequence_kl`, :func:`kl_filter_keep`): a sample with ``Â < 0`` whose per-sequence KL
  ``KL_b = mean_t k(gen_logp_t, old_logp_t)`` exceeds the threshold ``δ`` is dropped (strictly ``KL_b > δ``);
  every sample with ``Â ≥ 0`` is kept. ``k`` is an estimator of ``KL(π_gen ‖ π_R,old)`` on tokens sampled from
  ``π_gen`` (``algorithms.kl``: ``k1 = d``, ``k2 = ½d²``, ``k3 = exp(−d) + d − 1`` with
  ``d = clamp(gen_logp − old_logp, ±20)``). *(ours: the estimator, the per-token mean over the response and the
  clamp; the paper's summaries name "a KL threshold" on negative-advantage off-policy samples.)* The regime's
  default is ``k1``: ``KL_b`` is then the per-token log-likelihood ratio ``log(π_gen(o) / π_R,old(o)) / |o|``,
  large exactly when the receiver finds the sample much less likely than its generator did; ``k3`` also grows
  (exponentially) when the receiver finds it much *more* likely, which is no reason to drop it.
- **Loss** (:func:`ftis_loss`): the receiver's clipped GRPO/DAPO surrogate against ``π_R,old``, each token
  multiplied by its truncated weight::

      ρ_t = exp(clamp(logp_t − old_logp_t, ±20))
      ℓ_t = w_t · max(−ρ_t Â, −clip(ρ_t, 1 − clip_low, 1 + clip_high) Â)      (dual clip c on Â < 0 as in DAPO)
      ℓ_t += β · k(logp_t, ref_logp_t)                                           (KL to the reference, not IS-weighted)

  per-sequence ``weights`` multiply every token loss (KL included), and the total is ``aggregate(ℓ, mask, agg,
  ...)`` with the caller's global normalisers, so micro-batches add up to the mini-batch loss. At the first
  mini-batch ``ρ = 1`` and the gradient is ``−w_t Â ∇logp_t``, the truncated-IS policy gradient. *(ours: the
  truncated weight multiplies the PPO-clipped surrogate to ``π_R,old`` — the form of truncated IS for
  rollout/trainer mismatch — so later mini-batches of a step keep the trust region; the paper's summaries do not
  give the loss.)*
"""

from __future__ import annotations

import torch

from mutual_rl.algorithms.aggregation import aggregate, resolve_aggregation
from mutual_rl.algorithms.kl import kl_penalty, resolve_kl
from mutual_rl.algorithms.losses import check_clip_args
from mutual_rl.algorithms.masking import masked_mean

__all__ = ["ftis_loss", "kl_filter_keep", "sequence_kl", "tis_weights"]

_LOG_RATIO_CLAMP = 20.0


def tis_weights(old_logp: torch.Tensor, gen_logp: torch.Tensor, is_cap: float) -> torch.Tensor:
    """``min(exp(clamp(old_logp − gen_logp, ±20)), is_cap)``: ``[B, T]`` from two ``[B, T]`` log-probs
    (no gradient: the weight is a constant of the step)."""
    if not is_cap > 0:
        raise ValueError(f"is_cap must be > 0, got {is_cap}")
    log_ratio = (old_logp.detach() - gen_logp.detach()).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return torch.exp(log_ratio).clamp(max=is_cap)


def sequence_kl(gen_logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-sequence KL estimate ``[B]``: the mean over response tokens of ``k(gen_logp, old_logp)`` (``kind`` from
    ``algorithms.kl``: an estimate of ``KL(π_gen ‖ π_R,old)`` on tokens sampled from ``π_gen``), with the log-ratio
    clamped to ±20. A row without response tokens gets 0."""
    resolve_kl(kind)
    if gen_logp.shape != old_logp.shape or gen_logp.shape != mask.shape or gen_logp.dim() != 2:
        raise ValueError(f"gen_logp {tuple(gen_logp.shape)}, old_logp {tuple(old_logp.shape)}, mask "
                         f"{tuple(mask.shape)} must be [B, T]")
    g, o = gen_logp.detach().double(), old_logp.detach().double()
    d = (g - o).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    per_token = kl_penalty(d, torch.zeros_like(d), kind)  # k(gen, old): every estimator is a function of d
    m = mask.double()
    return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).to(gen_logp.dtype)


def kl_filter_keep(advantages: torch.Tensor, seq_kl: torch.Tensor, threshold: float | None) -> torch.Tensor:
    """Bool ``[B]``: False for the samples F-TIS drops, ``Â < 0`` and ``KL > threshold``; ``threshold=None``
    keeps every sample (no filter)."""
    if advantages.shape != seq_kl.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} and seq_kl {tuple(seq_kl.shape)} must both be [B]")
    if threshold is None:
        return torch.ones_like(advantages, dtype=torch.bool)
    return ~((advantages < 0) & (seq_kl > threshold))


def ftis_loss(logp, old_logp, gen_logp, advantages, mask, *, is_cap, clip_low=0.2, clip_high=0.28, dual_clip=None,
              agg="token-mean", weights=None, max_len=None, token_count=None, num_seqs=None, ref_logp=None,
              kl_coef=0.0, kl_kind="k3"):
    """F-TIS loss of peer rows (module doc) and its per-token metrics.

    logp, old_logp, gen_logp, mask, ref_logp: ``[B, T]``; advantages, weights: ``[B]``. Returns ``(loss,
    metrics)``; metrics (detached, over this call's masked tokens): ``peer/clip_frac_low|high``,
    ``peer/ratio_mean`` (``ρ`` to ``π_R,old``), ``peer/is_weight_mean`` (mean ``w``), ``peer/is_ratio_mean`` (mean
    untruncated ``π_R,old / π_gen``), ``peer/is_trunc_frac`` (share with ``π_R,old / π_gen > C``),
    ``peer/approx_kl`` (k3 of ``π_θ`` to ``π_R,old``), ``peer/num_tokens``.
    """
    resolve_aggregation(agg)
    resolve_kl(kl_kind)
    if logp.dim() != 2 or not (logp.shape == old_logp.shape == gen_logp.shape == mask.shape):
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, gen_logp "
                         f"{tuple(gen_logp.shape)}, mask {tuple(mask.shape)} must be [B, T]")
    check_clip_args(clip_low, clip_high, dual_clip, kl_coef, ref_logp)
    m = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(-1)  # [B, 1]
    w_is = tis_weights(old_logp, gen_logp, is_cap).to(logp.dtype)  # [B, T]
    ratio = torch.exp((logp - old_logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))  # [B, T]
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    surrogate = torch.maximum(-adv * ratio, -adv * ratio.clamp(lo, hi))
    neg = adv < 0
    if dual_clip is not None:
        surrogate = torch.where(neg, torch.minimum(surrogate, -adv * dual_clip), surrogate)
    loss_mat = w_is * surrogate
    if kl_coef != 0.0:
        loss_mat = loss_mat + kl_coef * kl_penalty(logp, ref_logp, kl_kind)
    if weights is not None:
        loss_mat = loss_mat * weights.to(logp.dtype).unsqueeze(-1)
    loss = aggregate(loss_mat, m, agg, max_len=max_len, token_count=token_count, num_seqs=num_seqs)
    with torch.no_grad():
        r = ratio.detach()
        raw = torch.exp((old_logp - gen_logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
        metrics = {
            "peer/clip_frac_low": masked_mean((neg & (r < lo)).to(logp.dtype), m),
            "peer/clip_frac_high": masked_mean(((adv > 0) & (r > hi)).to(logp.dtype), m),
            "peer/ratio_mean": masked_mean(r, m),
            "peer/is_weight_mean": masked_mean(w_is, m),
            "peer/is_ratio_mean": masked_mean(raw, m),
            "peer/is_trunc_frac": masked_mean((raw > is_cap).to(logp.dtype), m),
            "peer/approx_kl": masked_mean(kl_penalty(old_logp.detach(), logp.detach(), "k3"), m),
            "peer/num_tokens": m.sum(),
        }
    return loss, metrics
