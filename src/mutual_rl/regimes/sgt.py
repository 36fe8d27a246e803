"""SGT: Success-Gated Transfer (outcome level; docs/methods.md §5.4).

As implemented, for receiver ``R`` and each prompt ``q`` of its batch (success: ``reward > success_threshold``):

1. **Gate.** Open iff ``k_R(q) = 0`` and some peer has ``k_S(q) ≥ 1``.
2. **Draw.** One verified peer success is drawn uniformly among *all* peers' successes for ``q`` pooled (not
   first a source, then a response: a source with more successes is proportionally more likely). The
   candidates are ordered by source name, then by position in the source's group, and the draw is
   ``random.Random(f"{seed}:{step}:{R}:{prompt_id}").randrange(#candidates)`` with ``step`` the ``step`` field
   of ``R``'s own rollouts for ``q``: deterministic, independent of the peers' mapping order and of any other
   prompt, and stateless (a resumed run draws the same; nothing to checkpoint).
3. **Cross.** The drawn response crosses to ``R``'s tokenization as text (docs/methods.md §2.1, ``cross_rollouts``
   without trace alignment), after ``R``'s own prompt ids for ``q``.
4. **Loss, per update.** ``L_R = L_GRPO + λ · mean_{rescued o} [ (1/|o^R|) Σ_t −log π_R(o^R_t | q, o^R_<t) ]``,
   ``λ = coef`` *(ours: token-mean per response, then mean over the rescued responses)*, held **for every
   optimizer update, as the GRPO term is**. ``L_GRPO`` is ``R``'s unchanged own GRPO batch (``own_batch``, DAPO
   objective, ``split_rows`` mini-batches), applied at full weight in each mini-batch. The NLL term is a
   :class:`~mutual_rl.types.NLLTerm`: the step's rescued responses are spread evenly over the step's mini-batches
   (:func:`spread_rows`: a seeded permutation, then round-robin from the first mini-batch, so the counts differ by
   at most one), and each mini-batch that holds any adds ``λ ·`` the mean NLL of the rescued responses it holds.
   Every rescued response is used exactly once per PPO epoch. *(ours; replaces the earlier rule
   "λ / rescued responses of the step per response", under which the NLL weighed λ / M per update with M
   mini-batches while the GRPO term weighed 1 in each.)* The permutation is
   ``random.Random(f"{seed}:{step}:{R}:spread")``: deterministic and stateless like the draw. The NLL
   log-probs use the policy's sampling temperature, as every log-prob of the update does.

Applies in every direction and for any number of policies (with no peer groups delivered it is plain GRPO and
``nll`` is None; the module refuses a sharing regime on a single policy unless a recorded peer is replayed).

Flows per source (units: responses): the drawn success ``consumed``; on a gated prompt the other successes
``not_drawn`` and the failures ``not_success``; every response for a prompt whose gate is closed (``R`` had a
success, or no peer had one) ``gate_closed``; responses whose group pairs with none of ``R``'s groups ``no_own_group``. Peer groups pair with ``R``'s groups
by group identity (``regimes.base.pair_peer_groups``): a prompt that occurs twice in a batch is two gates, each
seeing the peers' groups of its own slot, so no peer response is counted twice.

Metrics: ``rescued/<source>`` (rescued prompts whose draw came from that source, every source listed),
``rescued`` (their total), ``gate_rate`` (fraction of ``R``'s prompts with the gate open; equal to
``rescued / #prompts``), ``all_fail_frac`` (fraction of ``R``'s prompts with ``k_R = 0``, open gate or not).
They are the plan's :class:`SGTStats`; the update reports the mean NLL itself (``nll``).

Constructor arguments (``init_args`` of ``model.regime`` in a config): ``coef`` (λ, default 0.1), ``seed`` (draw seed, default 0),
success comes from ``algorithm.success_threshold`` (the regime's ``success_threshold``, set by the module).

KL (``algorithm.kl_coef > 0``): on ``R``'s own rows (the GRPO batch); the NLL term's rescued rows carry no KL.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from mutual_rl.names import DropReason
from mutual_rl.regimes.base import Regime, group_key, own_batch, pair_peer_groups, register_regime, split_rows
from mutual_rl.regimes.crossing import cross_rollouts, receiver_prompt_ids
from mutual_rl.stats import prefixed
from mutual_rl.types import NLLTerm, ScoredGroup, TrainingPlan, collate


@dataclass(frozen=True)
class SGTStats:
    """SGT's statistics of a receiver's plan (``TrainingPlan.metrics``; logged as ``<receiver>/<name>``)."""

    rescued_by: Mapping[str, int] = field(metadata=prefixed("rescued/", key="<source>"))
    """Per source (each delivering one, 0 included): count of the rescued prompts whose draw came from it."""
    rescued: int
    """Count of the rescued prompts (gate open, one peer success drawn); the sum over ``rescued_by``."""
    gate_rate: float
    """Fraction of the receiver's prompts (groups) with the gate open (``rescued / #prompts``)."""
    all_fail_frac: float
    """Fraction of the receiver's prompts (groups) without a success of its own (``k_R = 0``)."""


def draw_index(seed: int, step: int, receiver: str, prompt_id: int, num_candidates: int) -> int:
    """The seeded uniform draw of SGT: an index in ``range(num_candidates)``."""
    return random.Random(f"{seed}:{step}:{receiver}:{prompt_id}").randrange(num_candidates)


def spread_rows(num_rows: int, num_updates: int, seed: int, step: int, receiver: str) -> list[list[int]]:
    """The rows ``range(num_rows)`` of the NLL term spread evenly over ``num_updates`` optimizer updates: a seeded
    permutation (``random.Random(f"{seed}:{step}:{receiver}:spread")``), then round-robin from update 0, each
    update's rows sorted. Every row appears exactly once; counts differ by at most one (update ``i`` holds
    ``ceil((num_rows - i) / num_updates)`` rows)."""
    if num_updates < 1:
        raise ValueError(f"sgt: spread_rows needs at least one update, got {num_updates}")
    order = list(range(num_rows))
    random.Random(f"{seed}:{step}:{receiver}:spread").shuffle(order)
    return [sorted(order[i::num_updates]) for i in range(num_updates)]


@register_regime("sgt")
class SGT(Regime):
    """Outcome-level sharing: one verified peer success per all-fail prompt, learnt by an NLL term.

    See the module docstring for the rule as implemented and the *ours* choices.

    Args:
        coef: lambda, the weight of the NLL term on rescued peer successes (paper: 0.1).
        seed: seed of the uniform draw among the peers' successes.
    """

    subscribes = ("rollout", "reward")
    stats_type = SGTStats

    def __init__(self, coef: float = 0.1, seed: int = 0):
        if coef < 0:
            raise ValueError(f"sgt: coef must be >= 0, got {coef}")
        self.coef = float(coef)
        self.seed = int(seed)

    def takes(self, group: ScoredGroup) -> tuple[int, dict[str, int]]:
        """As GRAFT's cross rule (§6.3), what SGT uses of a chosen peer group with ``k >= 1`` successes: one drawn
        success (consumed); the other successes are ``not_drawn``, the failures ``not_success``."""
        k = int((group.rewards > self.success_threshold).sum())
        return 1, {DropReason.NOT_DRAWN: k - 1, DropReason.NOT_SUCCESS: len(group.rollouts) - k}

    def plan(self, receiver, own, peers, num_mini_batches, scores=None):
        own = [g for g in own if g.rollouts]
        batch = own_batch(receiver, own)
        mini_batches = split_rows(len(batch), num_mini_batches)
        pairing = pair_peer_groups(own, peers)
        flows: dict[str, dict[str, int]] = {src: {} for src in peers}

        def count(src: str, reason: str, n: int) -> None:
            if n:
                flows[src][reason] = flows[src].get(reason, 0) + n

        for src, groups in pairing.unmatched.items():
            for g in groups:
                count(src, DropReason.NO_OWN_GROUP, len(g.rollouts))

        rescued: list = []  # drawn peer rollouts, in R's prompt order
        rescued_by = dict.fromkeys(peers, 0)
        all_fail = 0
        thr = self.success_threshold
        for g in own:
            groups = pairing.by_own[group_key(g)]
            k_own = int((g.rewards > thr).sum())
            all_fail += k_own == 0
            candidates = [  # (source, group, index) of every peer success for q, by source name then position
                (src, pg, i) for src, pg in sorted(groups, key=lambda sg: sg[0])
                for i in range(len(pg.rollouts)) if float(pg.rewards[i]) > thr
            ]
            if k_own > 0 or not candidates:
                for src, pg in groups:
                    count(src, DropReason.GATE_CLOSED, len(pg.rollouts))
                continue
            step = int(g.rollouts[0].step)
            src_d, g_d, i_d = candidates[draw_index(self.seed, step, receiver.name, g.prompt_id, len(candidates))]
            for src, pg in groups:
                successes = int((pg.rewards > thr).sum())
                count(src, DropReason.NOT_SUCCESS, len(pg.rollouts) - successes)
                count(src, "consumed", int(pg is g_d))
                count(src, DropReason.NOT_DRAWN, successes - int(pg is g_d))
            drawn = g_d.rollouts[i_d]
            rescued.append(drawn)
            rescued_by[src_d] += 1

        nll, crossed = None, []
        if rescued:
            crossed = cross_rollouts(receiver, rescued, receiver_prompt_ids(own))
            nll_batch = collate(crossed, torch.zeros(len(crossed)), receiver.tokenizer.pad_token_id)
            step = int(own[0].rollouts[0].step)
            nll_rows = spread_rows(len(crossed), len(mini_batches), self.seed, step, receiver.name)
            nll = NLLTerm(nll_batch, nll_rows, self.coef)
        metrics = SGTStats(rescued_by=rescued_by, rescued=len(rescued), gate_rate=len(rescued) / len(own),
                           all_fail_frac=all_fail / len(own))
        return TrainingPlan(batch, mini_batches, metrics=metrics, flows=flows, nll=nll, crossed=crossed)
