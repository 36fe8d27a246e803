"""PRP: Peer Rollout Pooling (data level; docs/methods.md §5.2), and its truncated-IS objective
(``PRPTruncatedIS``).

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
     first mini-batch).
   - ``peer_aligned``: the behaviour probability of a peer token ``t`` is ``exp(ℓ̃_t)``, the source trace
     aligned onto ``R``'s tokens by the THL (``granularity``, mass-preserving). The rows carry ``ℓ̃`` as their
     ``old_logp`` (the update never recomputes peer rows that are not marked ``needs_old_logp``, whatever
     ``algorithm.old_logp`` says).

   The denominator is the paper's one variable: the **objective form** (``objective``) is chosen separately and
   applies the same way under either denominator, so comparing the denominators never also compares loss forms.
   Peer token ratio ``ρ_t = exp(logp_t − old_logp_t)`` with ``old_logp`` the denominator above:

   - ``clip`` (default): the DAPO clipped surrogate (the base objective, ``DAPO``) on every row, own and peer
     alike.
   - ``tis``: own rows DAPO, peer rows truncated IS (objective ``PRPTruncatedIS``, ``update/objectives.py``; math
     in ``algorithms/importance.py``), with ``is_cap``; the batch's ``is_peer`` selects the rows.

Truncated importance sampling *(ours; the paper says "truncated importance weights" without an equation)*,
objective ``PRPTruncatedIS``, per peer token with ``ρ_t = exp(clamp(logp_t − old_logp_t, ±20))``, ``C = is_cap``::

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
``PRPTruncatedIS`` reports per token ``self/clip_frac_low|high``, ``self/ratio_mean`` (own tokens) and
``peer/ratio_mean`` (mean ρ), ``peer/is_abs_dev`` (mean ``|ρ − 1|``), ``peer/is_trunc_frac`` (fraction with
``ρ > C``) for peer tokens, ``approx_kl`` (k3 to the behaviour, all tokens: peer tokens against their
denominator, ``ℓ̃`` under ``peer_aligned``) and its
parts ``self/approx_kl`` (own tokens, against ``π_R,old``: comparable across regimes) and ``peer/approx_kl``.
The plan's own metrics are one :class:`PRPStats` (``TrainingPlan.metrics``).

Constructor arguments (``init_args`` of ``model.regime`` in a config): ``denominator`` (``learner_snapshot`` default | ``peer_aligned``),
``objective`` (``clip`` default | ``tis``), ``is_cap`` (C of ``tis``, default 2.0), ``granularity`` (THL alignment for ``peer_aligned``: ``word`` default |
``span``), ``eps`` (default 1e-6).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import torch

from mutual_rl.regimes.base import Regime, group_key, pair_peer_groups, register_regime, split_rows
from mutual_rl.regimes.crossing import cross_rollouts, receiver_prompt_ids
from mutual_rl.regimes.xgrpo import pooled_advantages
from mutual_rl.stats import prefixed
from mutual_rl.thl import GRANULARITIES
from mutual_rl.types import CrossedRollout, TrainingPlan, collate
from mutual_rl.update.objectives import PRPTruncatedIS

DENOMINATORS = ("learner_snapshot", "peer_aligned")
OBJECTIVES = ("clip", "tis")


@dataclass(frozen=True)
class PRPStats:
    """PRP's statistics of a receiver's plan (``TrainingPlan.metrics``), logged as ``<receiver>/prp/...``."""

    peer_rows: int = field(metadata=prefixed("prp/peer_rows"))
    """Count of the peer rows (crossed peer responses) pooled into the batch."""
    peer_frac: float = field(metadata=prefixed("prp/peer_frac"))
    """Fraction of the batch's rows that are peer rows."""
    pool_size: float = field(metadata=prefixed("prp/pool_size"))
    """Mean pooled group size (own plus peer responses per receiver group)."""
    peer_adv_mean: float = field(metadata=prefixed("prp/peer_adv_mean"))
    """Mean pooled advantage of the peer rows (0 without peer rows)."""


@register_regime("prp")
class PRP(Regime):
    """Data-level sharing: peers' groups pooled into R's batch (THL-crossed), pooled GRPO advantages.

    See the module docstring for the rule as implemented and the *ours* choices.

    Args:
        denominator: learner_snapshot (π_R,old on the retokenized response) or peer_aligned
            (THL-aligned peer trace): the denominator of the peer rows' token ratio.
        objective: the loss form on peer rows, the same under either denominator: clip (DAPO clipped surrogate,
            default) or tis (truncated importance weight, no clip).
        is_cap: C, the cap of the truncated importance weight (objective tis only; default 2.0).
        granularity: THL alignment granularity for peer_aligned: word (paper) or span.
        eps: ε added to the pooled std (default 1e-6).
    """

    subscribes = ("rollout", "reward")
    stats_type = PRPStats

    def __init__(self, denominator: Literal["learner_snapshot", "peer_aligned"] = "learner_snapshot",
                 is_cap: float = 2.0, granularity: Literal["word", "span"] = "word", eps: float = 1e-6,
                 objective: Literal["clip", "tis"] = "clip"):
        if denominator not in DENOMINATORS:
            raise ValueError(f"prp: denominator={denominator!r} is not one of: {', '.join(DENOMINATORS)}.")
        if objective not in OBJECTIVES:
            raise ValueError(f"prp: objective={objective!r} is not one of: {', '.join(OBJECTIVES)}.")
        if granularity not in GRANULARITIES:
            raise ValueError(f"prp: granularity={granularity!r} is not one of: {', '.join(GRANULARITIES)}.")
        if not is_cap > 0:
            raise ValueError(f"prp: is_cap must be > 0, got {is_cap}")
        if eps < 0:
            raise ValueError(f"prp: eps must be >= 0, got {eps}")
        self.denominator = denominator
        self.objective = objective
        self.is_cap = float(is_cap)
        self.granularity = granularity
        self.eps = float(eps)

    def plan(self, receiver, own, peers, num_mini_batches, scores=None):
        own = [g for g in own if g.rollouts]
        pairing = pair_peer_groups(own, peers)
        aligned = self.denominator == "peer_aligned"
        prompt_ids = receiver_prompt_ids(own)
        peer_rollouts = [r for g in own for _, pg in pairing.by_own[group_key(g)] for r in pg.rollouts]
        all_crossed = cross_rollouts(receiver, peer_rollouts, prompt_ids,
                                     granularity=self.granularity if aligned else None)
        if aligned:  # the rule: the aligned trace is the peer rows' behaviour log-prob (never recomputed)
            all_crossed = [dataclasses.replace(c, old_logp=c.source_logp) for c in all_crossed]
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
        objective = PRPTruncatedIS(is_cap=self.is_cap) if self.objective == "tis" and n_peer else None  # None: DAPO
        pa = torch.cat(peer_adv)
        metrics = PRPStats(peer_rows=n_peer, peer_frac=n_peer / len(batch), pool_size=sum(sizes) / len(sizes),
                           peer_adv_mean=float(pa.mean()) if len(pa) else 0.0)
        return TrainingPlan(batch, split_rows(len(batch), num_mini_batches), metrics=metrics, flows=pairing.flows(),
                            objective=objective, crossed=all_crossed)
