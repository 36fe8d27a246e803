"""Training objectives, one registry, one signature.

An objective maps one micro-batch to ``(loss, stats)``::

    fn(logp [b, T], sub: PolicyBatch, *, clip_low, clip_high, dual_clip, agg, kl_coef, kl_kind,
       token_count, num_seqs, max_len, ref_logp, update_index, **kwargs)

It takes tensors and scalars only (never a config object): the clip bounds, the dual clip, the aggregation mode
and the KL coefficient and estimator come from ``algorithm`` (``GRPOConfig.loss_kwargs()``); ``token_count`` /
``num_seqs`` are the *mini-batch's* normalisers (so micro-batch losses add up to the mini-batch loss), ``max_len``
the policy's configured maximum response length (the constant of ``seq-mean-token-sum-norm``), ``ref_logp`` the
reference's log-probs (``None`` without KL), ``update_index`` the optimizer update within the current training
step (0, 1, ... across PPO epochs; restarts every step) and ``kwargs`` come from the regime's
``TrainingPlan.objective_kwargs``. ``stats`` is an :class:`~mutual_rl.stats.ObjectiveStats`: per-token means over
this micro-batch's response tokens of all its rows, its own rows and its peer rows, each with its token count, which
the update uses to average them token-weighted (an objective registered with the older contract may still return a
mapping of the :mod:`mutual_rl.algorithms` names: ``clip_frac_low``, ``self/ratio_mean``, ``peer/num_tokens``, ...).
An objective that does not use a standard argument accepts and ignores it.

The math lives in ``mutual_rl.algorithms`` (pure tensor functions); the objectives here adapt a
:class:`~mutual_rl.types.PolicyBatch` to it. Every built-in objective is defined in this file, so the registry
never imports the regimes: ``dapo`` (every regime by default), ``prp_tis`` (PRP ``objective: tis``), ``hacpo`` and
``ftis`` (F-TIS).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mutual_rl.algorithms import kl_penalty, masked_mean, policy_loss
from mutual_rl.algorithms.ftis import ftis_loss
from mutual_rl.algorithms.hacpo import hacpo_sequence_loss, lower_bound
from mutual_rl.algorithms.importance import truncated_is_loss
from mutual_rl.stats import ObjectiveStats

Objective = Callable[..., tuple[torch.Tensor, ObjectiveStats]]
_OBJECTIVES: dict[str, Objective] = {}


def register_objective(name: str):
    def deco(fn: Objective) -> Objective:
        if name in _OBJECTIVES:
            raise ValueError(f"objective {name!r} is already registered")
        _OBJECTIVES[name] = fn
        return fn

    return deco


def get_objective(name: str) -> Objective:
    if name not in _OBJECTIVES:
        raise ValueError(f"Unknown objective {name!r}; choose one of: {', '.join(sorted(_OBJECTIVES))}.")
    return _OBJECTIVES[name]


def dapo_terms(logp, sub, *, clip_low, clip_high, dual_clip, agg, kl_coef, kl_kind, token_count, num_seqs,
               max_len, ref_logp, with_kl: bool = True):
    """``policy_loss`` on a micro-batch (``with_kl=False``: no KL term, for metrics computed without the
    reference)."""
    return policy_loss(
        logp, sub.old_logp, sub.advantages, sub.response_mask, clip_low=clip_low, clip_high=clip_high, agg=agg,
        weights=sub.weights, dual_clip=dual_clip, max_len=max_len, token_count=token_count, num_seqs=num_seqs,
        ref_logp=ref_logp if with_kl else None, kl_coef=kl_coef if with_kl else 0.0, kl_kind=kl_kind,
    )


def split_metrics(logp, sub, max_len, **loss) -> dict[str, torch.Tensor]:
    """Clip fractions, ratio and approx. KL of self and peer tokens separately (``self/...``, ``peer/...``)."""
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for tag, rows in (("self", ~sub.is_peer), ("peer", sub.is_peer)):
            if rows.any():
                part = sub.select(rows.nonzero().squeeze(-1))
                _, m = dapo_terms(logp.detach()[rows], part, **loss, token_count=None, num_seqs=None,
                                  max_len=max_len, ref_logp=None, with_kl=False)
                for k in ("clip_frac_low", "clip_frac_high", "ratio_mean", "approx_kl"):
                    out[f"{tag}/{k}"] = m[k]
                out[f"{tag}/num_tokens"] = m["num_tokens"]
    return out


def split_own_peer(sub, token_count, num_seqs):
    """``(token_count, num_seqs, own_rows, peer_rows)`` of a micro-batch (peer rows: ``sub.is_peer``); missing
    normalisers become this call's own counts over all its rows."""
    mask = sub.response_mask
    if token_count is None:
        token_count = mask.sum()
    if num_seqs is None:
        num_seqs = int((mask.sum(-1) > 0).sum())
    peer = sub.is_peer
    return token_count, num_seqs, (~peer).nonzero().squeeze(-1), peer.nonzero().squeeze(-1)


@register_objective("dapo")
def dapo(logp, sub, *, clip_low, clip_high, dual_clip, agg, kl_coef, kl_kind, token_count, num_seqs, max_len,
         ref_logp=None, update_index: int = 0):
    """DAPO token-level clipped surrogate (docs/methods.md §1) with per-sequence weights; self/peer metrics split.

    The KL penalty (``kl_coef``) covers every row of the batch, peer rows included: they are trained as the
    receiver's tokens, and ``ref_logp`` is the reference on those tokens."""
    loss_kw = dict(clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, agg=agg, kl_coef=kl_coef,
                   kl_kind=kl_kind)
    loss, metrics = dapo_terms(logp, sub, **loss_kw, token_count=token_count, num_seqs=num_seqs, max_len=max_len,
                               ref_logp=ref_logp)
    if sub.is_peer.any():
        metrics.update(split_metrics(logp, sub, max_len, **loss_kw))
    else:  # every row is own: ``self/approx_kl`` (logged by every objective, comparable across regimes) is approx_kl
        metrics["self/approx_kl"], metrics["self/num_tokens"] = metrics["approx_kl"], metrics["num_tokens"]
    return loss, ObjectiveStats.from_algorithm(metrics)


@register_objective("prp_tis")
def prp_tis(logp, sub, *, clip_low, clip_high, dual_clip, agg, kl_coef, kl_kind, token_count, num_seqs, max_len,
            ref_logp=None, update_index: int = 0, is_cap: float = 2.0):
    """PRP ``objective: tis`` (docs/methods.md §5.2): DAPO on own rows + truncated IS
    (:func:`~mutual_rl.algorithms.importance.truncated_is_loss`) on peer rows.

    Peer rows (``sub.is_peer``) use their ``old_logp`` as behaviour log-probs: the aligned peer trace
    (``denominator: peer_aligned``) or ``π_R,old`` recomputed before the update (``learner_snapshot``);
    the two parts share the global normalisers, so the sum is micro-batch invariant.
    """
    token_count, num_seqs, own_rows, peer_rows = split_own_peer(sub, token_count, num_seqs)
    mask = sub.response_mask
    loss = logp.sum() * 0.0
    metrics: dict[str, torch.Tensor] = {}
    if len(own_rows):
        part = sub.select(own_rows)
        own_loss, m = dapo_terms(logp[own_rows], part, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip,
                                 agg=agg, kl_coef=kl_coef, kl_kind=kl_kind, token_count=token_count,
                                 num_seqs=num_seqs, max_len=max_len,
                                 ref_logp=ref_logp[own_rows] if ref_logp is not None else None)
        loss = loss + own_loss
        for k in ("clip_frac_low", "clip_frac_high", "ratio_mean", "num_tokens"):
            metrics[f"self/{k}"] = m[k]
    if len(peer_rows):
        part = sub.select(peer_rows)
        peer_loss, m = truncated_is_loss(
            logp[peer_rows], part.old_logp, part.advantages, part.response_mask, is_cap, agg,
            part.weights, max_len, token_count, num_seqs,
            ref_logp[peer_rows] if kl_coef else None, kl_coef, kl_kind,
        )
        loss = loss + peer_loss
        metrics.update(m)
    with torch.no_grad():
        k3 = kl_penalty(sub.old_logp, logp.detach(), "k3")
        metrics["approx_kl"] = masked_mean(k3, mask)  # all rows: peer tokens against their denominator
        for tag, rows in (("self", own_rows), ("peer", peer_rows)):  # own rows: against R's old policy
            if len(rows):
                metrics[f"{tag}/approx_kl"] = masked_mean(k3[rows], mask[rows])
        if ref_logp is not None:
            metrics["kl"] = masked_mean(kl_penalty(logp.detach(), ref_logp, kl_kind), mask)
        metrics["num_tokens"] = mask.sum()
    return loss, ObjectiveStats.from_algorithm(metrics)


@register_objective("hacpo")
def hacpo(logp, sub, *, clip_low, clip_high, dual_clip, agg, kl_coef, kl_kind, token_count, num_seqs, max_len,
          ref_logp=None, update_index: int = 0,
          lower: float | None = None, lower_start: float = 0.8, lower_slope: float = 0.025, lower_m0: int = 0,
          lower_per_update: int = 1, alpha: float = 1.0, self_clip_low: float = 3e-4, self_clip_high: float = 4e-4,
          log_ratio_clamp: float = 10.0, kl_peer_rows: bool = False):
    """HACPO's sequence-level objective (docs/methods.md §5.6,
    :func:`~mutual_rl.algorithms.hacpo.hacpo_sequence_loss`); needs the batch's ``source_mean_logp`` and ``cap_ratio``.
    ``num_seqs`` is the mini-batch's sequence count (micro-batch invariant). The DAPO clip bounds, ``agg``,
    ``token_count`` and ``max_len`` do not apply (HACPO clips sequence ratios with its own bounds and takes a
    sequence mean).

    The peer clip's lower bound is ``L_m = min(1, lower_start + lower_slope · m)`` with
    ``m = lower_m0 + lower_per_update · update_index``; ``lower`` given fixes ``L_m`` instead. The KL term covers
    own rows only unless ``kl_peer_rows``. Adds ``self/approx_kl`` (per-token k3 to ``R``'s old policy on own
    rows, as every objective logs it)."""
    if lower is None:
        lower = lower_bound(lower_m0 + lower_per_update * update_index, lower_start, lower_slope)
    loss, metrics = hacpo_sequence_loss(
        logp, sub.response_mask, sub.old_logp, sub.source_mean_logp, sub.advantages, sub.is_peer,
        sub.cap_ratio, lower=lower, num_seqs=num_seqs, alpha=alpha, self_clip_low=self_clip_low,
        self_clip_high=self_clip_high, log_ratio_clamp=log_ratio_clamp, ref_logp=ref_logp, kl_coef=kl_coef,
        kl_kind=kl_kind, kl_peer_rows=kl_peer_rows,
    )
    if "self/num_tokens" in metrics:  # own rows with tokens (their old_logp is R's behaviour policy)
        with torch.no_grad():
            own = sub.response_mask * (~sub.is_peer).to(sub.response_mask.device).unsqueeze(-1)
            metrics["self/approx_kl"] = masked_mean(kl_penalty(sub.old_logp, logp.detach(), "k3"), own)
    return loss, ObjectiveStats.from_algorithm(metrics)


@register_objective("ftis")
def ftis(logp, sub, *, clip_low, clip_high, dual_clip, agg, kl_coef, kl_kind, token_count, num_seqs, max_len,
         ref_logp=None, update_index: int = 0, is_cap: float = 2.0):
    """F-TIS (docs/methods.md §5.7): DAPO on own rows + the truncated-IS-weighted clipped surrogate
    (:func:`~mutual_rl.algorithms.ftis.ftis_loss`) on peer rows.

    Peer rows (``sub.is_peer``): their ``old_logp`` is the receiver's ``π_R,old`` and ``sub.gen_logp``
    (``[b, T]``) the generator's trace; the weight is ``min(π_R,old / π_gen, is_cap)``.
    Both parts share the global normalisers (this call's own counts over *all* its rows when none are given), so
    the sum is micro-batch invariant. The KL penalty covers every row. ``approx_kl`` (all rows) and its parts
    ``self/approx_kl`` / ``peer/approx_kl`` are k3 to ``π_R,old``.
    """
    token_count, num_seqs, own_rows, peer_rows = split_own_peer(sub, token_count, num_seqs)
    mask = sub.response_mask
    loss = logp.sum() * 0.0
    metrics: dict[str, torch.Tensor] = {}
    clip = dict(clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, agg=agg, kl_coef=kl_coef,
                kl_kind=kl_kind)
    if len(own_rows):
        own_loss, m = dapo_terms(logp[own_rows], sub.select(own_rows), **clip, token_count=token_count,
                                 num_seqs=num_seqs, max_len=max_len,
                                 ref_logp=ref_logp[own_rows] if ref_logp is not None else None)
        loss = loss + own_loss
        for k in ("clip_frac_low", "clip_frac_high", "ratio_mean", "approx_kl", "num_tokens"):
            metrics[f"self/{k}"] = m[k]
    if len(peer_rows):
        part = sub.select(peer_rows)
        peer_loss, m = ftis_loss(
            logp[peer_rows], part.old_logp, part.gen_logp, part.advantages, part.response_mask,
            is_cap=is_cap, **clip, weights=part.weights, max_len=max_len, token_count=token_count,
            num_seqs=num_seqs, ref_logp=ref_logp[peer_rows] if ref_logp is not None else None,
        )
        loss = loss + peer_loss
        metrics.update(m)
    with torch.no_grad():
        metrics["approx_kl"] = masked_mean(kl_penalty(sub.old_logp, logp.detach(), "k3"), mask)
        if ref_logp is not None:
            metrics["kl"] = masked_mean(kl_penalty(logp.detach(), ref_logp, kl_kind), mask)
        metrics["num_tokens"] = mask.sum()
    return loss, ObjectiveStats.from_algorithm(metrics)
