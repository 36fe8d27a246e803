"""Training objectives: each a frozen record of exactly the parameters it uses, with one method::

    objective.loss(logp [b, T], sub: PolicyBatch, norms: Norms, ref_logp=None, update_index=0)
        -> (loss, ObjectiveStats)

``norms`` are the *mini-batch's* normalisers (so micro-batch losses add up to the mini-batch loss, :class:`Norms`),
``ref_logp`` the reference's log-probs (``None`` without KL), ``update_index`` the optimizer update within the
current training step (0, 1, ... across PPO epochs; restarts every step). ``stats`` is an
:class:`~mutual_rl.stats.ObjectiveStats`: per-token means over this micro-batch's response tokens of all its rows, its
own rows and its peer rows, each with its token count, which the update uses to average them token-weighted.

A regime's plan names its objective (``TrainingPlan.objective``); ``None`` is :class:`DAPO` with the algorithm's
scalars (``GRPOConfig.dapo()``). The algorithm's scalars an objective needs but a regime does not choose (the DAPO
terms of :class:`PRPTruncatedIS` and :class:`FTISObjective`, the KL of :class:`HACPOObjective`) are ``None`` in the
plan; the update completes the objective with them (:func:`resolve`, each class's ``with_algorithm``). A custom
regime puts its own object with these two methods in its plan (:class:`Objective`).

The math lives in ``mutual_rl.algorithms`` (pure tensor functions); the objectives here adapt a
:class:`~mutual_rl.types.PolicyBatch` to it. They never import the regimes: :class:`DAPO` (every regime by default),
:class:`PRPTruncatedIS` (PRP ``objective: tis``), :class:`HACPOObjective` and :class:`FTISObjective` (F-TIS).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from mutual_rl.algorithms import kl_penalty, masked_mean, policy_loss
from mutual_rl.algorithms.ftis import ftis_loss
from mutual_rl.algorithms.hacpo import hacpo_sequence_loss, lower_bound
from mutual_rl.algorithms.importance import truncated_is_loss
from mutual_rl.stats import ObjectiveStats
from mutual_rl.types import Norms, Objective

__all__ = ["DAPO", "FTISObjective", "HACPOObjective", "Norms", "Objective", "PRPTruncatedIS", "resolve"]


def resolve(objective: Objective | None, base: DAPO) -> Objective:
    """The objective a plan trains with: ``objective`` completed with the algorithm's scalars; ``None``: ``base``."""
    return base if objective is None else objective.with_algorithm(base)


def _given(value, owner, name: str):
    if value is None:
        raise ValueError(f"{type(owner).__name__}.{name} is None: complete the objective with the algorithm's "
                         "scalars first (objective.with_algorithm(GRPOConfig.dapo())).")
    return value


@dataclass(frozen=True)
class DAPO:
    """DAPO token-level clipped surrogate (docs/methods.md §1) with per-sequence weights; self/peer metrics split.

    The KL penalty (``kl_coef``) covers every row of the batch, peer rows included: they are trained as the
    receiver's tokens, and ``ref_logp`` is the reference on those tokens. Built from the algorithm's config by
    ``GRPOConfig.dapo()``."""

    clip_low: float
    clip_high: float
    dual_clip: float | None
    agg: str
    kl_coef: float
    kl_kind: str

    def with_algorithm(self, base: DAPO) -> DAPO:
        return self

    def terms(self, logp, sub, token_count, num_seqs, max_len, ref_logp, with_kl: bool = True):
        """``policy_loss`` on a micro-batch (``with_kl=False``: no KL term, for metrics computed without the
        reference)."""
        return policy_loss(
            logp, sub.old_logp, sub.advantages, sub.response_mask, clip_low=self.clip_low, clip_high=self.clip_high,
            agg=self.agg, weights=sub.weights, dual_clip=self.dual_clip, max_len=max_len, token_count=token_count,
            num_seqs=num_seqs, ref_logp=ref_logp if with_kl else None, kl_coef=self.kl_coef if with_kl else 0.0,
            kl_kind=self.kl_kind,
        )

    def own_rows(self, logp, sub, own_rows, token_count, num_seqs, max_len, ref_logp,
                 keys: tuple[str, ...]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """DAPO on the own rows of a micro-batch whose peer rows another term trains (PRP ``tis``, F-TIS), with the
        micro-batch's shared normalisers: ``(loss, {"self/<key>": ...})``; ``(0, {})`` without own rows."""
        zero = logp.sum() * 0.0  # every row in the graph, as the peer term's rows are
        if not len(own_rows):
            return zero, {}
        loss, m = self.terms(logp[own_rows], sub.select(own_rows), token_count, num_seqs, max_len,
                             ref_logp[own_rows] if ref_logp is not None else None)
        return zero + loss, {f"self/{k}": m[k] for k in keys}

    def split_metrics(self, logp, sub, max_len, peer: tuple[bool, ...]) -> dict[str, torch.Tensor]:
        """Clip fractions, ratio and approx. KL of self and peer tokens separately (``self/...``, ``peer/...``);
        ``peer``: per row, whether it is a peer row (host flags)."""
        out: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for tag in ("self", "peer"):
                rows = [i for i, p in enumerate(peer) if p == (tag == "peer")]
                if rows:
                    part = sub.select(rows)
                    _, m = self.terms(logp.detach()[rows], part, None, None, max_len, None, with_kl=False)
                    for k in ("clip_frac_low", "clip_frac_high", "ratio_mean", "approx_kl"):
                        out[f"{tag}/{k}"] = m[k]
                    out[f"{tag}/num_tokens"] = m["num_tokens"]
        return out

    def loss(self, logp, sub, norms, ref_logp=None, update_index=0):
        loss, metrics = self.terms(logp, sub, norms.token_count, norms.num_seqs, norms.max_len, ref_logp)
        peer = norms.peer_flags(sub)
        if any(peer):
            metrics.update(self.split_metrics(logp, sub, norms.max_len, peer))
        else:  # every row is own: ``self/approx_kl`` (logged by every objective, comparable across regimes)
            metrics["self/approx_kl"], metrics["self/num_tokens"] = metrics["approx_kl"], metrics["num_tokens"]
        return loss, ObjectiveStats.from_algorithm(metrics)


def _own_peer(sub, norms: Norms):
    """``(token_count, num_seqs, own_rows, peer_rows)`` of a micro-batch (peer rows: ``sub.is_peer``); missing
    normalisers become this call's own counts over all its rows."""
    mask = sub.response_mask
    token_count, num_seqs = norms.token_count, norms.num_seqs
    if token_count is None:
        token_count = mask.sum()
    if num_seqs is None:
        num_seqs = int((mask.sum(-1) > 0).sum())
    peer = norms.peer_flags(sub)
    return token_count, num_seqs, [i for i, p in enumerate(peer) if not p], [i for i, p in enumerate(peer) if p]


def _present(norms: Norms, sub) -> dict[str, bool]:
    """Whether the micro-batch has own (``self``) and peer rows with response tokens (host flags)."""
    peer, has = norms.peer_flags(sub), norms.token_flags(sub)
    return {"self": any(h and not p for p, h in zip(peer, has)), "peer": any(h and p for p, h in zip(peer, has))}


@dataclass(frozen=True)
class PRPTruncatedIS:
    """PRP ``objective: tis`` (docs/methods.md §5.2): DAPO on own rows + truncated IS
    (:func:`~mutual_rl.algorithms.importance.truncated_is_loss`) on peer rows, with DAPO's ``agg`` and KL.

    Peer rows (``sub.is_peer``) use their ``old_logp`` as behaviour log-probs: the aligned peer trace
    (``denominator: peer_aligned``) or ``π_R,old`` recomputed before the update (``learner_snapshot``);
    the two parts share the global normalisers, so the sum is micro-batch invariant.
    """

    is_cap: float
    """C, the cap of the importance weight."""
    dapo: DAPO | None = None
    """Own rows' DAPO (``None``: the algorithm's)."""

    def with_algorithm(self, base: DAPO) -> PRPTruncatedIS:
        return self if self.dapo is not None else dataclasses.replace(self, dapo=base)

    def loss(self, logp, sub, norms, ref_logp=None, update_index=0):
        dapo = _given(self.dapo, self, "dapo")
        token_count, num_seqs, own_rows, peer_rows = _own_peer(sub, norms)
        mask = sub.response_mask
        loss, metrics = dapo.own_rows(logp, sub, own_rows, token_count, num_seqs, norms.max_len, ref_logp,
                                      ("clip_frac_low", "clip_frac_high", "ratio_mean", "num_tokens"))
        if len(peer_rows):
            part = sub.select(peer_rows)
            peer_loss, m = truncated_is_loss(
                logp[peer_rows], part.old_logp, part.advantages, part.response_mask, self.is_cap, dapo.agg,
                part.weights, norms.max_len, token_count, num_seqs,
                ref_logp[peer_rows] if dapo.kl_coef else None, dapo.kl_coef, dapo.kl_kind,
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
                metrics["kl"] = masked_mean(kl_penalty(logp.detach(), ref_logp, dapo.kl_kind), mask)
            metrics["num_tokens"] = mask.sum()
        return loss, ObjectiveStats.from_algorithm(metrics)


@dataclass(frozen=True)
class HACPOObjective:
    """HACPO's sequence-level objective (docs/methods.md §5.6,
    :func:`~mutual_rl.algorithms.hacpo.hacpo_sequence_loss`); needs the batch's ``source_mean_logp`` and
    ``cap_ratio``. ``norms.num_seqs`` is the mini-batch's sequence count (micro-batch invariant); its other
    normalisers do not apply (HACPO takes a sequence mean). The regime (``regimes/hacpo.py``) holds the defaults.

    The peer clip's lower bound is ``L_m = min(1, lower_start + lower_slope · m)`` with
    ``m = lower_m0 + lower_per_update · update_index`` (:meth:`lower`). The KL term covers own rows only unless
    ``kl_peer_rows``. Adds ``self/approx_kl`` (per-token k3 to ``R``'s old policy on own rows, as every objective
    logs it)."""

    lower_start: float
    lower_slope: float
    lower_m0: int
    lower_per_update: int
    alpha: float
    """Exponent of the stop-gradient factor of the peer term."""
    self_clip_low: float
    self_clip_high: float
    """Clip range ``[1 − self_clip_low, 1 + self_clip_high]`` of the self sequence ratio."""
    log_ratio_clamp: float
    """Clamp of ``ℓ̄_R − ℓ̄_src`` before exp."""
    kl_peer_rows: bool
    kl_coef: float | None = None
    """β of the KL penalty (``None``: the algorithm's)."""
    kl_kind: str | None = None
    """KL estimator (``None``: the algorithm's)."""

    def with_algorithm(self, base: DAPO) -> HACPOObjective:
        return dataclasses.replace(self, kl_coef=base.kl_coef if self.kl_coef is None else self.kl_coef,
                                   kl_kind=base.kl_kind if self.kl_kind is None else self.kl_kind)

    def lower(self, update_index: int) -> float:
        """``L_m`` of the step's optimizer update ``update_index``."""
        return lower_bound(self.lower_m0 + self.lower_per_update * update_index, self.lower_start, self.lower_slope)

    def loss(self, logp, sub, norms, ref_logp=None, update_index=0):
        loss, metrics = hacpo_sequence_loss(
            logp, sub.response_mask, sub.old_logp, sub.source_mean_logp, sub.advantages, sub.is_peer,
            sub.cap_ratio, lower=self.lower(update_index), num_seqs=norms.num_seqs, alpha=self.alpha,
            present=_present(norms, sub),
            self_clip_low=self.self_clip_low, self_clip_high=self.self_clip_high,
            log_ratio_clamp=self.log_ratio_clamp, ref_logp=ref_logp, kl_coef=_given(self.kl_coef, self, "kl_coef"),
            kl_kind=_given(self.kl_kind, self, "kl_kind"), kl_peer_rows=self.kl_peer_rows,
        )
        if "self/num_tokens" in metrics:  # own rows with tokens (their old_logp is R's behaviour policy)
            with torch.no_grad():
                own = sub.response_mask * (~sub.is_peer).to(sub.response_mask.device).unsqueeze(-1)
                metrics["self/approx_kl"] = masked_mean(kl_penalty(sub.old_logp, logp.detach(), "k3"), own)
        return loss, ObjectiveStats.from_algorithm(metrics)


@dataclass(frozen=True)
class FTISObjective:
    """F-TIS (docs/methods.md §5.7): DAPO on own rows + the truncated-IS-weighted clipped surrogate
    (:func:`~mutual_rl.algorithms.ftis.ftis_loss`, with DAPO's clip, ``agg`` and KL) on peer rows.

    Peer rows (``sub.is_peer``): their ``old_logp`` is the receiver's ``π_R,old`` and ``sub.gen_logp``
    (``[b, T]``) the generator's trace; the weight is ``min(π_R,old / π_gen, is_cap)``.
    Both parts share the global normalisers (this call's own counts over *all* its rows when none are given), so
    the sum is micro-batch invariant. The KL penalty covers every row. ``approx_kl`` (all rows) and its parts
    ``self/approx_kl`` / ``peer/approx_kl`` are k3 to ``π_R,old``.
    """

    is_cap: float
    """Cap of the importance weight."""
    dapo: DAPO | None = None
    """Own rows' DAPO and the peer term's clip (``None``: the algorithm's)."""

    def with_algorithm(self, base: DAPO) -> FTISObjective:
        return self if self.dapo is not None else dataclasses.replace(self, dapo=base)

    def loss(self, logp, sub, norms, ref_logp=None, update_index=0):
        dapo = _given(self.dapo, self, "dapo")
        token_count, num_seqs, own_rows, peer_rows = _own_peer(sub, norms)
        mask = sub.response_mask
        loss, metrics = dapo.own_rows(logp, sub, own_rows, token_count, num_seqs, norms.max_len, ref_logp,
                                      ("clip_frac_low", "clip_frac_high", "ratio_mean", "approx_kl", "num_tokens"))
        if len(peer_rows):
            part = sub.select(peer_rows)
            peer_loss, m = ftis_loss(
                logp[peer_rows], part.old_logp, part.gen_logp, part.advantages, part.response_mask,
                is_cap=self.is_cap, clip_low=dapo.clip_low, clip_high=dapo.clip_high, dual_clip=dapo.dual_clip,
                agg=dapo.agg, kl_coef=dapo.kl_coef, kl_kind=dapo.kl_kind, weights=part.weights,
                max_len=norms.max_len, token_count=token_count, num_seqs=num_seqs,
                ref_logp=ref_logp[peer_rows] if ref_logp is not None else None,
            )
            loss = loss + peer_loss
            metrics.update(m)
        with torch.no_grad():
            metrics["approx_kl"] = masked_mean(kl_penalty(sub.old_logp, logp.detach(), "k3"), mask)
            if ref_logp is not None:
                metrics["kl"] = masked_mean(kl_penalty(logp.detach(), ref_logp, dapo.kl_kind), mask)
            metrics["num_tokens"] = mask.sum()
        return loss, ObjectiveStats.from_algorithm(metrics)
