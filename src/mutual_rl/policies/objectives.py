"""Training objectives, one registry, one signature.

An objective maps one micro-batch to ``(loss, metrics)``::

    fn(logp [b, T], sub: PolicyBatch, *, cfg: GRPOConfig, token_count, num_seqs, max_len, ref_logp, update_index,
       **kwargs)

where ``token_count`` / ``num_seqs`` are the *mini-batch's* normalisers (so micro-batch losses add up to the
mini-batch loss), ``max_len`` the policy's configured maximum response length (the constant of
``seq-mean-token-sum-norm``), ``update_index`` the optimizer update within the current training step (0, 1, ...
across PPO epochs; restarts every step; passed only to objectives that take it, by name or through ``**kwargs``)
and ``kwargs`` come from the regime's ``TrainingPlan.objective_kwargs``. Per-token metrics are
means over this micro-batch's response tokens; the update averages them token-weighted.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mutual_rl.algorithms import policy_loss

Objective = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
_OBJECTIVES: dict[str, Objective] = {}


def register_objective(name: str):
    def deco(fn: Objective) -> Objective:
        if name in _OBJECTIVES:
            raise ValueError(f"objective {name!r} is already registered")
        _OBJECTIVES[name] = fn
        return fn

    return deco


def get_objective(name: str) -> Objective:
    from mutual_rl.regimes.base import _load_builtin_regimes  # regimes register their objectives

    _load_builtin_regimes()
    if name not in _OBJECTIVES:
        raise ValueError(f"Unknown objective {name!r}; choose one of: {', '.join(sorted(_OBJECTIVES))}.")
    return _OBJECTIVES[name]


def dapo_terms(logp, sub, cfg, token_count, num_seqs, max_len, ref_logp, *, with_kl: bool = True):
    """``policy_loss`` on a micro-batch with the trainer's settings (``with_kl=False``: no KL term, for
    metrics computed without the reference)."""
    return policy_loss(
        logp, sub.old_logp, sub.advantages, sub.response_mask, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
        agg=cfg.agg, weights=sub.weights, dual_clip=cfg.dual_clip, max_len=max_len, token_count=token_count,
        num_seqs=num_seqs, ref_logp=ref_logp if with_kl else None, kl_coef=cfg.kl_coef if with_kl else 0.0,
        kl_kind=cfg.kl_kind,
    )


def split_metrics(logp, sub, cfg, max_len) -> dict[str, torch.Tensor]:
    """Clip fractions and ratio of self and peer tokens separately (``self/...``, ``peer/...``)."""
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for tag, rows in (("self", ~sub.is_peer), ("peer", sub.is_peer)):
            if rows.any():
                part = sub.select(rows.nonzero().squeeze(-1))
                _, m = dapo_terms(logp.detach()[rows], part, cfg, None, None, max_len, None, with_kl=False)
                for k in ("clip_frac_low", "clip_frac_high", "ratio_mean"):
                    out[f"{tag}/{k}"] = m[k]
                out[f"{tag}/num_tokens"] = m["num_tokens"]
    return out


@register_objective("dapo")
def dapo(logp, sub, *, cfg, token_count, num_seqs, max_len, ref_logp=None, update_index: int = 0):
    """DAPO token-level clipped surrogate (docs/methods.md §1) with per-sequence weights; self/peer metrics split.

    The KL penalty (``cfg.kl_coef``) covers every row of the batch, peer rows included: they are trained as the
    receiver's tokens, and ``ref_logp`` is the reference on those tokens."""
    loss, metrics = dapo_terms(logp, sub, cfg, token_count, num_seqs, max_len, ref_logp)
    if sub.is_peer.any():
        metrics.update(split_metrics(logp, sub, cfg, max_len))
    return loss, metrics
