"""PRP: Peer Rollout Pooling (data level; docs/methods.md §5.2), and its truncated-IS objective ``prp_tis``.

As implemented, for receiver ``R`` and each prompt ``q`` of its batch:

1. **Pool.** ``R``'s rows for ``q`` are its own group followed by every peer's group for ``q`` (peers in their
   mapping order, i.e. the trainer's policy order), each peer response crossed to ``R``'s tokenization as text
   by the THL (``cross_rollouts``, after ``R``'s own prompt ids for ``q``). A peer missing ``q`` adds nothing.
   Peer groups pair with ``R``'s groups by group identity (``regimes.base.pair_peer_groups``): a prompt that
   occurs twice in the batch gives two pooled groups, each with the peers' group of its own slot.
2. **Advantages** over the pooled group: ``Â_j = (r_j − mean(pool)) / (std(pool) + eps)`` (GRPO normalisation,
   unbiased std, zero-variance pool or pool of size 1 → 0), for own and peer rows alike *(ours: the paper pools
   trajectories; pooled normalisation is our rule)*. The advantages the groups arrived with are not used.
3. **Mini-batches.** ``split_rows`` over the pooled batch, rows in ``R``'s prompt order (each prompt's own rows
   then its peer rows), so a mini-batch holds whole pooled groups when the sizes divide.
4. **Denominator** of the peer rows' token ratio (``denominator``):

   - ``learner_snapshot``: ``π_R,old`` on the retokenized response. Peer rows are marked ``needs_old_logp``;
     the update recomputes their old log-probs under ``R`` before its first optimizer step (ratio 1 at the
     first mini-batch), then the standard ``dapo`` objective applies to every row.
   - ``peer_aligned``: the behaviour probability of a peer token ``t`` is ``exp(ℓ̃_t)``, the source trace
     aligned onto ``R``'s tokens by the THL (``granularity``, mass-preserving). The rows carry ``ℓ̃`` as their
     ``old_logp`` (the update never recomputes peer rows that are not marked ``needs_old_logp``, whatever
     ``algorithm.old_logp`` says); ``extras["tis"]`` (``[B]`` float, 1 on peer rows) selects the rule. Objective
     ``prp_tis`` (below), with ``is_cap``.

Truncated importance sampling *(ours; the paper says "truncated importance weights" without an equation)*,
objective ``prp_tis``, per peer token with ``ρ_t = exp(clamp(logp_t − ℓ̃_t, ±20))``, ``C = is_cap``::

    ℓ_t = −sg(min(ρ_t, C)) · Â · exp(logp_t − sg(logp_t))      (value −min(ρ_t, C)·Â, gradient −min(ρ_t, C)·Â·∇logp_t)

i.e. a truncated-IS policy gradient with no PPO clip on peer tokens (the weight is capped, never the update
direction); per-sequence ``weights`` multiply it; a KL penalty (``algorithm.kl_coef``) is added as in DAPO.
Own rows keep the DAPO clipped surrogate with ``R``'s old policy. Both parts are aggregated with the
mini-batch's global normalisers (``token_count`` / ``num_seqs``, or this call's own counts over *all* its
rows when none are given) and summed; every aggregation mode is a sum over rows divided by a global
normaliser, so splitting a mini-batch into micro-batches changes no gradient.

Flows (units: peer responses): ``consumed`` when the peer group pairs with one of ``R``'s groups, else
``no_own_group``.

KL (``algorithm.kl_coef > 0``): on every row, own and peer alike, against the reference's log-probs of the
row's tokens in ``R``'s tokenization (peer responses are trained as ``R``'s tokens, so the penalty applies to
them as to any token ``R`` is pushed towards).

Metrics of the plan: ``prp/peer_rows`` (peer rows in the batch), ``prp/peer_frac`` (their share of rows),
``prp/pool_size`` (mean pooled group size), ``prp/peer_adv_mean`` (mean pooled advantage of the peer rows).
``prp_tis`` reports per token ``self/clip_frac_low|high``, ``self/ratio_mean`` (own tokens) and
``peer/ratio_mean`` (mean ρ), ``peer/is_abs_dev`` (mean ``|ρ − 1|``), ``peer/is_trunc_frac`` (fraction with
``ρ > C``) for peer tokens, and ``approx_kl`` (k3 to the behaviour, all tokens).

Constructor arguments (``regime_args``): ``denominator`` (``learner_snapshot`` default | ``peer_aligned``),
``is_cap`` (C, default 2.0), ``granularity`` (THL alignment for ``peer_aligned``: ``word`` default |
``span``), ``eps`` (default 1e-6).
"""

from __future__ import annotations

import torch

from mutual_rl.algorithms import aggregate, kl_penalty, masked_mean
from mutual_rl.policies.batch import collate
from mutual_rl.policies.objectives import dapo_terms, register_objective
from mutual_rl.regimes.base import (
    Regime,
    TrainingPlan,
    group_key,
    pair_peer_groups,
    register_regime,
    split_rows,
)
from mutual_rl.regimes.crossing import cross_rollouts, receiver_prompt_ids
from mutual_rl.regimes.xgrpo import pooled_advantages
from mutual_rl.thl import GRANULARITIES
from mutual_rl.types import CrossedRollout

DENOMINATORS = ("learner_snapshot", "peer_aligned")
_LOG_RATIO_CLAMP = 20.0


@register_regime("prp")
class PRP(Regime):
    """Data-level sharing: peers' groups pooled into ``R``'s batch (THL-crossed), pooled GRPO advantages.

    See the module docstring for the rule as implemented and the *ours* choices.

    Args:
        denominator: ``learner_snapshot`` (π_R,old on the retokenized response) or ``peer_aligned``
            (THL-aligned peer trace, truncated IS).
        is_cap: C, the cap of the truncated importance weight (``peer_aligned`` only; default 2.0).
        granularity: THL alignment granularity for ``peer_aligned``: ``word`` (paper) or ``span``.
        eps: ε added to the pooled std (default 1e-6).
    """

    subscribes = ("rollout", "reward")

    def __init__(self, denominator: str = "learner_snapshot", is_cap: float = 2.0, granularity: str = "word",
                 eps: float = 1e-6):
        if denominator not in DENOMINATORS:
            raise ValueError(f"prp: denominator={denominator!r} is not one of: {', '.join(DENOMINATORS)}.")
        if granularity not in GRANULARITIES:
            raise ValueError(f"prp: granularity={granularity!r} is not one of: {', '.join(GRANULARITIES)}.")
        if not is_cap > 0:
            raise ValueError(f"prp: is_cap must be > 0, got {is_cap}")
        if eps < 0:
            raise ValueError(f"prp: eps must be >= 0, got {eps}")
        self.denominator = denominator
        self.is_cap = float(is_cap)
        self.granularity = granularity
        self.eps = float(eps)

    def plan(self, receiver, own, peers, num_mini_batches):
        own = [g for g in own if g.rollouts]
        pairing = pair_peer_groups(own, peers)
        aligned = self.denominator == "peer_aligned"
        prompt_ids = receiver_prompt_ids(own)
        peer_rollouts = [r for g in own for _, pg in pairing.by_own[group_key(g)] for r in pg.rollouts]
        all_crossed = cross_rollouts(receiver, peer_rollouts, prompt_ids,
                                     granularity=self.granularity if aligned else None)
        crossed = iter(all_crossed)
        rows, advs, sizes, peer_adv = [], [], [], []
        for g in own:
            pgs = [pg for _, pg in pairing.by_own[group_key(g)]]
            adv = pooled_advantages(g.rewards, [pg.rewards for pg in pgs], self.eps)
            rows.extend(g.rollouts)
            rows.extend(next(crossed) for pg in pgs for _ in pg.rollouts)
            advs.append(adv)
            peer_adv.append(adv[len(g.rollouts):])
            sizes.append(len(adv))
        is_peer = torch.tensor([isinstance(r, CrossedRollout) for r in rows], dtype=torch.bool)
        batch = collate(rows, torch.cat(advs), receiver.tokenizer.pad_token_id, is_peer=is_peer)
        n_peer = int(is_peer.sum())
        objective, kwargs = "dapo", {}
        if aligned and n_peer:
            batch.extras["tis"] = is_peer.float()
            objective, kwargs = "prp_tis", {"is_cap": self.is_cap}
        pa = torch.cat(peer_adv)
        metrics = {
            "prp/peer_rows": float(n_peer),
            "prp/peer_frac": n_peer / len(batch),
            "prp/pool_size": sum(sizes) / len(sizes),
            "prp/peer_adv_mean": float(pa.mean()) if len(pa) else 0.0,
        }
        return TrainingPlan(batch, split_rows(len(batch), num_mini_batches), metrics=metrics, flows=pairing.flows(),
                            objective=objective, objective_kwargs=kwargs, crossed=all_crossed)


def truncated_is_terms(logp, behaviour_logp, advantages, mask, is_cap, agg, weights, max_len, token_count,
                       num_seqs, ref_logp=None, kl_coef=0.0, kl_kind="k3"):
    """Truncated-IS policy-gradient loss of peer rows (see module doc) and its per-token metrics.

    logp, behaviour_logp, mask: ``[b, T]``; advantages, weights: ``[b]``; returns ``(loss, metrics)``.
    """
    m = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    rho = torch.exp((logp.detach() - behaviour_logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))  # [b, T]
    w_is = rho.clamp(max=is_cap)
    loss_mat = -w_is * adv * torch.exp(logp - logp.detach())
    if kl_coef:
        loss_mat = loss_mat + kl_coef * kl_penalty(logp, ref_logp, kl_kind)
    loss_mat = loss_mat * weights.to(logp.dtype).unsqueeze(-1)
    loss = aggregate(loss_mat, m, agg, max_len=max_len, token_count=token_count, num_seqs=num_seqs)
    metrics = {
        "peer/ratio_mean": masked_mean(rho, m),
        "peer/is_abs_dev": masked_mean((rho - 1).abs(), m),
        "peer/is_trunc_frac": masked_mean((rho > is_cap).to(logp.dtype), m),
        "peer/num_tokens": m.sum(),
    }
    return loss, metrics


@register_objective("prp_tis")
def prp_tis(logp, sub, *, cfg, token_count, num_seqs, max_len, ref_logp=None, update_index: int = 0, is_cap=2.0):
    """PRP ``peer_aligned``: DAPO on own rows + truncated IS against the aligned peer trace on peer rows.

    Rows with ``sub.extras["tis"] > 0`` use their ``old_logp`` (the aligned peer trace) as behaviour log-probs;
    the two parts share the global normalisers, so the sum is micro-batch invariant.
    """
    mask = sub.response_mask
    if token_count is None:
        token_count = mask.sum()
    if num_seqs is None:
        num_seqs = int((mask.sum(-1) > 0).sum())
    tis = sub.extras["tis"] > 0
    loss = logp.sum() * 0.0
    metrics: dict[str, torch.Tensor] = {}
    own_rows, peer_rows = (~tis).nonzero().squeeze(-1), tis.nonzero().squeeze(-1)
    kl_on = bool(cfg.kl_coef)
    if len(own_rows):
        part = sub.select(own_rows)
        own_loss, m = dapo_terms(logp[own_rows], part, cfg, token_count, num_seqs, max_len,
                                 ref_logp[own_rows] if ref_logp is not None else None)
        loss = loss + own_loss
        for k in ("clip_frac_low", "clip_frac_high", "ratio_mean", "num_tokens"):
            metrics[f"self/{k}"] = m[k]
    if len(peer_rows):
        part = sub.select(peer_rows)
        peer_loss, m = truncated_is_terms(
            logp[peer_rows], part.old_logp, part.advantages, part.response_mask, is_cap, cfg.agg,
            part.weights, max_len, token_count, num_seqs,
            ref_logp[peer_rows] if kl_on else None, cfg.kl_coef, cfg.kl_kind,
        )
        loss = loss + peer_loss
        metrics.update(m)
    with torch.no_grad():
        metrics["approx_kl"] = masked_mean(kl_penalty(sub.old_logp, logp.detach(), "k3"), mask)
        if ref_logp is not None:
            metrics["kl"] = masked_mean(kl_penalty(logp.detach(), ref_logp, cfg.kl_kind), mask)
        metrics["num_tokens"] = mask.sum()
    return loss, metrics
