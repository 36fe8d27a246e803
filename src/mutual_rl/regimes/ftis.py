"""F-TIS: Filtered Truncated Importance Sampling (docs/methods.md §5.7; Blagoev et al. 2026, arXiv 2605.22537), a
baseline the GRAFT paper cites.

What the paper states (from its abstract and its authors' summaries; the full text was not available to us):
heterogeneous models collaborate in one GRPO run by sharing generated tokens and their per-token log-probs;
peers' completions enter a node's GRPO loss with truncated importance weights (TIS), and off-policy completions
with a negative advantage are filtered out by a KL threshold. Its exact loss, KL estimator and default values are
not given there, so every such detail below is marked *(ours)*.

As implemented, for receiver ``R`` and each of its groups ``g`` (prompt ``q``):

1. **Pool.** ``R``'s rows for ``g`` are its own group followed by every paired peer group (peers in their mapping
   order, i.e. the trainer's policy order), each peer response crossed to ``R``'s tokenization as text by the THL
   (``cross_rollouts``, after ``R``'s own prompt ids). Peer groups pair with ``R``'s groups by group identity
   (``regimes.base.pair_peer_groups``): a prompt twice in the batch gives two pooled groups, each with the peers'
   group of its own slot.
2. **Advantages** (``advantage``). ``pooled`` (default): ``Â_j = (r_j − mean(pool)) / (std(pool) + eps)`` over
   the pooled group, own and peer rows alike (unbiased std; zero-variance pool or pool of one → 0) *(our reading
   of the paper's setting, in which the completions of one GRPO group are generated in parallel by the
   collaborating nodes and the advantage is group-relative over all of them)*. ``source``: own rows keep the
   advantages ``R``'s groups arrived with and peer rows the source-computed ones *(ours, for comparison)*.
   Advantages are computed on the whole pool *before* filtering.
3. **Generator log-probs** ``ℓ^gen``: with a shared vocabulary (the crossed response has the source's own token
   ids and spans) the peer's token log-probs directly, as the paper defines it; across vocabularies *(ours)* the
   source trace aligned onto ``R``'s tokens by the THL (``granularity``, mass-preserving; ``span`` by default
   *(ours)*, so identical tokenizations give the trace back unchanged), as PRP ``peer_aligned``.
4. **Receiver log-probs** ``ℓ^R_old``: ``R``'s log-probs of the crossed tokens under its current weights (no-grad,
   its sampling temperature), before any update: they are the peer rows' ``old_logp`` (never recomputed). The regime
   asks for them (``request``) and the step computes them (``mutual_rl.step.scoring``: forwards packed to
   ``algorithm.max_tokens_per_micro_batch``).
5. **Filter.** Per peer response ``KL = mean_t k(ℓ^gen_t, ℓ^R_old_t)``, an estimate of ``KL(π_gen ‖ π_R,old)``
   per token on the generator's samples (``filter_kl``; default ``k1 = ℓ^gen − ℓ^R_old``, so ``KL`` is the
   per-token log-likelihood ratio of the response) *(ours: estimator, per-token mean)*; a response with
   ``Â < 0`` and ``KL > kl_threshold`` is dropped; ``Â ≥ 0`` is always kept. ``kl_threshold=None`` turns the
   filter off (plain TIS, an ablation).
6. **Objective** ``FTISObjective`` (``update/objectives.py``; math in ``algorithms/ftis.py``): own rows the DAPO
   clipped surrogate with ``R``'s old policy; peer rows the same clipped surrogate against ``π_R,old`` with every
   token multiplied by ``w_t = min(exp(ℓ^R_old_t − ℓ^gen_t), is_cap)`` *(ours: the PPO clip kept on peer rows; at
   the first mini-batch the gradient is ``−w_t Â ∇logp_t``)*. Both parts use the mini-batch's global normalisers
   (``token_count`` / ``num_seqs``), so micro-batching changes no gradient; the DAPO terms are the algorithm's.
   Without a kept peer row the plan is plain DAPO.
7. **Mini-batches.** ``split_rows`` over the batch in ``R``'s prompt order (each group's own rows, then its kept
   peer rows).

Flows (units: peer responses; they sum to what was delivered): ``consumed`` (kept), ``kl_filtered`` (``Â < 0``
and ``KL > kl_threshold``), ``no_own_group`` (the peer group answers no group of ``R``).

KL penalty (``algorithm.kl_coef > 0``): on every row, own and kept peer rows alike, against the reference's
log-probs of ``R``'s tokens; it is not importance-weighted.

Metrics of the plan: ``ftis/peer_rows`` (kept peer rows), ``ftis/peer_frac`` (their share of rows),
``ftis/pool_size`` (mean pooled group size before filtering), ``ftis/filtered`` (dropped responses),
``ftis/filtered_frac`` (dropped / paired peer responses), ``ftis/neg_frac`` (share of paired peer responses with
``Â < 0``), ``ftis/peer_adv_mean`` (mean advantage of the kept peer rows) and, when any peer response was
paired, ``ftis/peer_kl_mean`` / ``ftis/peer_kl_max`` (their per-sequence KL). The objective adds
``self/clip_frac_low|high``, ``self/ratio_mean``, ``self/approx_kl``, ``peer/clip_frac_low|high``,
``peer/ratio_mean``, ``peer/is_weight_mean``, ``peer/is_ratio_mean``, ``peer/is_trunc_frac`` (share of peer tokens
with ``π_R,old / π_gen > is_cap``), ``peer/approx_kl`` and ``approx_kl`` (all rows, k3 to ``π_R,old``).
The plan's own metrics are one :class:`FTISStats` (``TrainingPlan.metrics``).

Constructor arguments (``init_args`` of ``model.regime``): ``is_cap`` (2.0), ``kl_threshold`` (1.0), ``filter_kl``
(``k1``), ``advantage`` (``pooled``), ``granularity`` (``span``), ``eps`` (1e-6). The
defaults are ours (the paper's values were not available).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import torch

from mutual_rl.algorithms import KL_ESTIMATORS
from mutual_rl.algorithms.ftis import kl_filter_keep, sequence_kl
from mutual_rl.names import DropReason
from mutual_rl.regimes.base import (
    Regime,
    group_key,
    pair_peer_groups,
    register_regime,
    require_scores,
    split_rows,
)
from mutual_rl.regimes.crossing import cross_rollouts, receiver_prompt_ids
from mutual_rl.regimes.xgrpo import pooled_advantages
from mutual_rl.stats import prefixed
from mutual_rl.thl import GRANULARITIES
from mutual_rl.types import CrossedRollout, Scores, ScoringRequest, TrainingPlan, collate
from mutual_rl.update.objectives import FTISObjective

ADVANTAGES = ("pooled", "source")


@dataclass(frozen=True)
class FTISStats:
    """F-TIS's statistics of a plan (``TrainingPlan.metrics``; the module docstring's ``ftis/...`` names)."""

    peer_rows: int = field(metadata=prefixed("ftis/peer_rows"))
    """Count of the peer rows kept in the batch (paired peer responses not filtered)."""
    peer_frac: float = field(metadata=prefixed("ftis/peer_frac"))
    """Fraction of the batch's rows that are peer rows."""
    pool_size: float = field(metadata=prefixed("ftis/pool_size"))
    """Mean pooled group size before filtering (own plus paired peer responses per receiver group)."""
    filtered: int = field(metadata=prefixed("ftis/filtered"))
    """Count of the paired peer responses dropped by the KL filter."""
    filtered_frac: float = field(metadata=prefixed("ftis/filtered_frac"))
    """Fraction of the paired peer responses dropped by the KL filter (0 when none was paired)."""
    neg_frac: float = field(metadata=prefixed("ftis/neg_frac"))
    """Fraction of the paired peer responses with a negative advantage (0 when none was paired)."""
    peer_adv_mean: float = field(metadata=prefixed("ftis/peer_adv_mean"))
    """Mean advantage of the kept peer rows (0 without one)."""
    peer_kl_mean: float | None = field(default=None, metadata=prefixed("ftis/peer_kl_mean"))
    """Mean per-token KL estimate of the paired peer responses (nats per token; ``None``: none paired)."""
    peer_kl_max: float | None = field(default=None, metadata=prefixed("ftis/peer_kl_max"))
    """Largest per-token KL estimate of a paired peer response (nats per token; ``None``: none paired)."""


def generator_logp(crossed: CrossedRollout) -> torch.Tensor:
    """``[T]`` the generator's log-probs of the crossed tokens: the source's own trace when the receiver's tokens
    are the source's (same ids and spans: a shared vocabulary), else the THL-aligned trace."""
    src = crossed.source
    if torch.equal(crossed.response_ids, src.response_ids) and tuple(crossed.offsets) == tuple(src.offsets):
        return src.logp.float()
    return crossed.source_logp.float()


@register_regime("ftis")
class FTIS(Regime):
    """F-TIS: peers' samples in R's GRPO loss with truncated importance weights; negative-advantage samples
    filtered by a KL threshold.

    See the module docstring for the rule as implemented and the *ours* choices.

    Args:
        is_cap: C, the cap of the importance weight min(π_R,old / π_gen, C) (default 2.0).
        kl_threshold: δ; a peer sample with negative advantage and per-token KL(π_gen ‖ π_R,old) above it is
            dropped (default 1.0 nat per token; null = no filter).
        filter_kl: KL estimator of the filter: k1 (default: the per-token log-likelihood ratio) | k2 | k3.
        advantage: pooled (GRPO over the receiver's group and the peers' groups for the prompt) or source
            (every row keeps the advantage it arrived with).
        granularity: THL alignment of a cross-vocabulary peer trace: span (default) or word.
        eps: ε added to the pooled std (default 1e-6).
    """

    subscribes = ("rollout", "reward")
    stats_type = FTISStats

    def __init__(self, is_cap: float = 2.0, kl_threshold: float | None = 1.0,
                 filter_kl: Literal["k1", "k2", "k3"] = "k1", advantage: Literal["pooled", "source"] = "pooled",
                 granularity: Literal["span", "word"] = "span", eps: float = 1e-6):
        if not is_cap > 0:
            raise ValueError(f"ftis: is_cap must be > 0, got {is_cap}")
        if kl_threshold is not None and not kl_threshold >= 0:
            raise ValueError(f"ftis: kl_threshold must be >= 0 (or null for no filter), got {kl_threshold}")
        if filter_kl not in KL_ESTIMATORS:
            raise ValueError(f"ftis: filter_kl={filter_kl!r} is not one of: {', '.join(KL_ESTIMATORS)}.")
        if advantage not in ADVANTAGES:
            raise ValueError(f"ftis: advantage={advantage!r} is not one of: {', '.join(ADVANTAGES)}.")
        if granularity not in GRANULARITIES:
            raise ValueError(f"ftis: granularity={granularity!r} is not one of: {', '.join(GRANULARITIES)}.")
        if eps < 0:
            raise ValueError(f"ftis: eps must be >= 0, got {eps}")
        self.is_cap = float(is_cap)
        self.kl_threshold = None if kl_threshold is None else float(kl_threshold)
        self.filter_kl = filter_kl
        self.advantage = advantage
        self.granularity = granularity
        self.eps = float(eps)
        # the record kinds read from peers: source advantages only when they are used
        self.subscribes = ("rollout", "reward", "advantage") if advantage == "source" else ("rollout", "reward")

    def _advantages(self, g, pgs) -> torch.Tensor:
        """``[len(g) + Σ len(pg)]``: own rows then every paired peer group's, by ``advantage``."""
        if self.advantage == "pooled":
            return pooled_advantages(g.rewards, [pg.rewards for pg in pgs], self.eps)
        return torch.cat([g.advantages.float(), *[pg.advantages.float() for pg in pgs]])

    def _filter(self, crossed, r_logp, advantages) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """Per crossed response: keep (bool ``[N]``), its KL ``[N]`` and its generator trace."""
        gen = [generator_logp(c) for c in crossed]
        if not crossed:
            return torch.zeros(0, dtype=torch.bool), torch.zeros(0), gen
        width = max(max(len(t) for t in gen), 1)
        g_mat, r_mat, mask = (torch.zeros(len(crossed), width) for _ in range(3))
        for i, (gt, rt) in enumerate(zip(gen, r_logp)):
            g_mat[i, : len(gt)], r_mat[i, : len(rt)], mask[i, : len(gt)] = gt, rt, 1.0
        kl = sequence_kl(g_mat, r_mat, mask, self.filter_kl)
        return kl_filter_keep(advantages, kl, self.kl_threshold), kl, gen

    def request(self, receiver, own, peers) -> ScoringRequest:
        """The receiver's log-probs of every paired peer response, crossed with its trace aligned (step 1)."""
        own = [g for g in own if g.rollouts]
        pairing = pair_peer_groups(own, peers)
        paired = [(g, pairing.by_own[group_key(g)]) for g in own]  # (own group, [(source, peer group)])
        all_crossed = cross_rollouts(receiver, [r for _, pgs in paired for _, pg in pgs for r in pg.rollouts],
                                     receiver_prompt_ids(own), granularity=self.granularity)
        return ScoringRequest(rows=tuple(all_crossed), state=(pairing, paired, all_crossed))

    def plan(self, receiver, own, peers, num_mini_batches, scores: Scores | None = None):
        pairing, paired, all_crossed = require_scores(self, scores).state
        r_logp = list(scores.logp)
        advs = [self._advantages(g, [pg for _, pg in pgs]) for g, pgs in paired]
        peer_adv = torch.cat([a[len(g.rollouts):] for (g, _), a in zip(paired, advs)]) if advs else torch.zeros(0)
        keep, kl, gen = self._filter(all_crossed, r_logp, peer_adv)

        rows, row_adv, gen_rows, sizes = [], [], [], []
        pos = 0
        flows: dict[str, dict[str, int]] = {}
        for (g, pgs), adv in zip(paired, advs):
            rows.extend(g.rollouts)
            row_adv.append(adv[: len(g.rollouts)])
            gen_rows.extend([None] * len(g.rollouts))
            sizes.append(len(adv))
            for src, pg in pgs:
                f = flows.setdefault(src, {})
                for _ in pg.rollouts:
                    if keep[pos]:
                        rows.append(dataclasses.replace(all_crossed[pos], old_logp=r_logp[pos]))
                        row_adv.append(peer_adv[pos : pos + 1])
                        gen_rows.append(gen[pos])
                        f["consumed"] = f.get("consumed", 0) + 1
                    else:
                        f[DropReason.KL_FILTERED] = f.get(DropReason.KL_FILTERED, 0) + 1
                    pos += 1
        for src, gs in pairing.unmatched.items():
            n = sum(len(g.rollouts) for g in gs)
            if n:
                flows.setdefault(src, {})[DropReason.NO_OWN_GROUP] = n
        for src in peers:  # a source that delivered nothing usable still has an (empty) account
            flows.setdefault(src, {})

        is_peer = torch.tensor([isinstance(r, CrossedRollout) for r in rows], dtype=torch.bool)
        batch = collate(rows, torch.cat(row_adv), receiver.tokenizer.pad_token_id, is_peer=is_peer,
                        needs_old_logp=[False] * len(rows))
        n_peer = int(is_peer.sum())
        objective = None  # DAPO
        if n_peer:
            gen_mat = torch.zeros(len(rows), batch.response_width)
            for i, t in enumerate(gen_rows):
                if t is not None:
                    gen_mat[i, : len(t)] = t
            batch.gen_logp = gen_mat
            objective = FTISObjective(is_cap=self.is_cap)
        metrics = _stats(n_peer, len(batch), sizes, peer_adv, keep, kl)
        return TrainingPlan(batch, split_rows(len(batch), num_mini_batches), metrics=metrics,
                            flows={src: {k: v for k, v in f.items() if v} for src, f in flows.items()},
                            objective=objective, crossed=all_crossed)


def _stats(n_peer: int, n_rows: int, sizes: list[int], peer_adv: torch.Tensor, keep: torch.Tensor,
           kl: torch.Tensor) -> FTISStats:
    """The plan's statistics: its rows, the pooled groups' sizes, the paired peer responses' advantages, which of
    them the KL filter kept, and their KLs."""
    n_paired = len(peer_adv)
    kept_adv = peer_adv[keep] if n_paired else torch.zeros(0)
    return FTISStats(
        peer_rows=n_peer,
        peer_frac=n_peer / n_rows,
        pool_size=sum(sizes) / len(sizes),
        filtered=n_paired - n_peer,
        filtered_frac=(n_paired - n_peer) / n_paired if n_paired else 0.0,
        neg_frac=float((peer_adv < 0).float().mean()) if n_paired else 0.0,
        peer_adv_mean=float(kept_adv.mean()) if len(kept_adv) else 0.0,
        peer_kl_mean=float(kl.mean()) if n_paired else None,
        peer_kl_max=float(kl.max()) if n_paired else None,
    )
