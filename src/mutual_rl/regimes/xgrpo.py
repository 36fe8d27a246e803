"""XGRPO: Cross-Policy GRPO Advantage Sharing (value level; docs/methods.md §5.3).

The receiver ``R`` trains on its own rollouts only (strictly on-policy); only the peers' *scalar rewards* for
the same prompt cross, so no THL is involved. As implemented, for every prompt ``q`` of ``R``'s batch:

- pooled rewards ``∪_p R_p(q)`` = ``R``'s own rewards for ``q`` followed by those of every peer that answered
  ``q`` (a peer missing ``q`` simply contributes nothing); peer groups are paired with ``R``'s groups by group
  identity (``regimes.base.pair_peer_groups``), so a prompt that occurs twice in a batch pools each of ``R``'s
  groups with the peers' group of the same slot only;
- ``Â_i^R = (r_i^R − mean(∪_p R_p(q))) / (std(∪_p R_p(q)) + ε)`` for ``R``'s own responses only, ``std``
  unbiased (``torch.std``); a zero-variance pool and a pooled group of size 1 give ``Â = 0`` exactly
  (``algorithms.grpo_advantages`` on the pool as one group). *(ours: the paper states "on-policy rollouts,
  baseline from rewards pooled across the policy pool" and gives no equation; this formula is our rule.)*
- The advantages are always recomputed from the pool, also for a prompt no peer answered (then it is plain
  GRPO on ``R``'s group with this regime's ``eps``; keep ``eps`` equal to ``algorithm.eps`` for N = 1 to
  reproduce the trainer's own advantages exactly). The std scale is always on (``algorithm.scale`` is not
  consulted).
- Mini-batches: ``split_rows`` over ``R``'s own rows in its prompt order (as plain GRPO); DAPO objective.

Flows (units: peer responses): a peer response is ``consumed`` (as its reward) when its group pairs with one
of ``R``'s groups, else dropped ``no_own_group``.

Metrics: ``xgrpo/pooled_frac`` (fraction of ``R``'s prompts with at least one peer group), ``xgrpo/pool_size``
(mean pooled group size), ``xgrpo/adv_abs_diff`` (mean ``|Â^XGRPO − Â^GRPO|`` over ``R``'s rows, against the
advantages ``R``'s groups arrived with) and ``xgrpo/signal_frac`` (fraction of ``R``'s rows with ``Â ≠ 0``):
the plan's :class:`XGRPOStats`.

Constructor arguments (``init_args`` of ``model.regime`` in a config): ``eps`` (the ε above, default ``1e-6``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from mutual_rl.algorithms import grpo_advantages
from mutual_rl.regimes.base import Regime, group_key, pair_peer_groups, register_regime, split_rows
from mutual_rl.stats import prefixed
from mutual_rl.types import TrainingPlan, collate


@dataclass(frozen=True)
class XGRPOStats:
    """XGRPO's statistics of a plan (``TrainingPlan.metrics``; the module docstring's ``xgrpo/...`` names)."""

    pooled_frac: float = field(metadata=prefixed("xgrpo/pooled_frac"))
    """Fraction of the receiver's prompts (groups) with at least one paired peer group."""
    pool_size: float = field(metadata=prefixed("xgrpo/pool_size"))
    """Mean pooled group size (own plus peer rewards per receiver group)."""
    adv_abs_diff: float = field(metadata=prefixed("xgrpo/adv_abs_diff"))
    """Mean over the receiver's rows of ``|Â^XGRPO − Â^GRPO|`` (GRPO's: the advantages they arrived with)."""
    signal_frac: float = field(metadata=prefixed("xgrpo/signal_frac"))
    """Fraction of the receiver's rows with a non-zero pooled advantage."""


def pooled_advantages(own: torch.Tensor, others: Sequence[torch.Tensor], eps: float) -> torch.Tensor:
    """GRPO advantages of the pooled rewards ``cat(own, *others)`` as one group: ``[len(own) + Σ len(others)]``."""
    pool = torch.cat([own.float(), *[o.float() for o in others]])
    return grpo_advantages(pool, torch.zeros(len(pool), dtype=torch.long), eps=eps)


@register_regime("xgrpo")
class XGRPO(Regime):
    """Value-level sharing: R's own rollouts with a baseline pooled over every policy's rewards for q.

    See the module docstring for the rule as implemented (the formula is *ours*).

    Args:
        eps: ε added to the pooled std (default 1e-6, as algorithm.eps).
    """

    subscribes = ("reward",)
    stats_type = XGRPOStats

    def __init__(self, eps: float = 1e-6):
        if eps < 0:
            raise ValueError(f"xgrpo: eps must be >= 0, got {eps}")
        self.eps = float(eps)

    def plan(self, receiver, own, peers, num_mini_batches, scores=None):
        own = [g for g in own if g.rollouts]
        pairing = pair_peer_groups(own, peers)
        rollouts, advs, old_advs, sizes, pooled = [], [], [], [], 0
        for g in own:
            others = [pg.rewards for _, pg in pairing.by_own[group_key(g)]]
            adv = pooled_advantages(g.rewards, others, self.eps)[: len(g.rollouts)]
            rollouts.extend(g.rollouts)
            advs.append(adv)
            old_advs.append(g.advantages.float())
            sizes.append(len(g.rollouts) + sum(len(o) for o in others))
            pooled += bool(others)
        adv = torch.cat(advs)
        batch = collate(rollouts, adv, receiver.tokenizer.pad_token_id)
        metrics = XGRPOStats(pooled_frac=pooled / len(own), pool_size=sum(sizes) / len(sizes),
                             adv_abs_diff=float((adv - torch.cat(old_advs)).abs().mean()),
                             signal_frac=float((adv != 0).float().mean()))
        return TrainingPlan(batch, split_rows(len(batch), num_mini_batches), metrics=metrics,
                            flows=pairing.flows())
