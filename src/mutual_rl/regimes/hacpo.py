"""HACPO: capability-weighted pooled baseline and sequence-level ratios (docs/methods.md §5.6, from the public HACPO code).

HACPO is a baseline (GRAFT's comparison). As implemented, for receiver ``R``:

- **Pooled group** ``G(q)``: ``R``'s own group for ``q`` followed by every peer's group for ``q`` (peers in
  delivery order), peers crossed into ``R``'s tokenization as text (THL, no trace alignment). Peer groups for a
  prompt ``R`` has no group for are dropped (``no_own_group``).
- **Capability** ``P_k``: rolling mean over the last ``window`` (5) training steps of policy ``k``'s
  positive-reward rate, the fraction of its responses with ``reward > success_threshold`` (0) among the groups
  ``R`` owns (``k = R``) or received from ``k`` this step; the current step is included (as the public HACPO code,
  which adds a step's rewards to the window before that step's advantages); *(ours)* steps are
  identified by ``Rollout.step``: seeing a step again replaces its entry (a replanned step is counted once). A policy that
  delivered nothing this step keeps its window. ``P_k`` is floored at ``1e-8``; ``ratio_k = clip(P_R / P_k,
  0.1, 10)`` (own rows: 1). The windows are regime state (``state_dict``).
- **Baseline** ``b = mean_{j∈G(q)} r_j · ratio_{src(j)}``; the plain mean if all rewards in ``G(q)`` are
  identical; ``R``'s own mean reward if ``b > 1``. ``Â_j = (r_j − b) / (std(G(q)) + 1e-6)``, ``std`` unbiased
  (``torch.std``); a pooled group of size 1 has ``std = 0`` (and ``Â = 0``, its rewards being identical).
- **Objective** ``HACPOObjective`` (``update/objectives.py``; math in ``algorithms/hacpo.py``; built by the
  constructor, which holds its defaults), per sequence ``j`` with ``ℓ̄`` = mean token log-prob:
  ``s_j = exp(clamp(ℓ̄_R − ℓ̄_src, ±10))``, ``ℓ̄_R`` under the current receiver policy (differentiable);
  ``ℓ̄_src`` = own rows: mean of ``R``'s old log-probs (``PolicyBatch.old_logp``); peer rows: mean of the
  source's own sampled trace in its own tokenization (extra ``src_mean_logp``).
  Self term ``min(s Â, clip(s, 1 − 3e-4, 1 + 4e-4) Â)``; peer term
  ``clip(s, L_m, 1) · sg(clip(s, L_m, 1))^α · (P_src / P_R) · Â`` with ``P_src / P_R = 1 / ratio_src``
  (the clipped ratio; extra ``cap_ratio``), ``L_m = min(1, 0.8 + 0.025 m)``, ``α = 1``.
  ``loss = −Σ_j term_j / num_seqs`` (sequence mean with the *mini-batch's* ``num_seqs``, so micro-batches sum to
  the mini-batch loss). KL (when ``algorithm.kl_coef > 0``; the shipped YAML uses k3, 1e-3) *(aggregation
  ours)*: ``+ kl_coef · Σ_{j own} tokenmean_t(kl_t) / num_seqs`` (sequence-mean of per-sequence token means),
  on ``R``'s own rows only, as the public HACPO code (``kl_peer_rows=True``: on every row).
  ``PolicyBatch.weights`` are not used (all 1).
- **m** (``lower_schedule``): ``update`` (default, as the public HACPO code) — the index of the optimizer update
  (mini-batch) within the current training step, counted across PPO epochs and restarting at 0 every step, so
  with 4 mini-batches ``L_m`` runs 0.8, 0.825, 0.85, 0.875 in every step and never reaches 1; ``step`` — the
  number of plans this regime has built for ``R`` before the current one (kept in state), constant within a
  step: ``L_m = 1`` from step 8 on with the defaults, and then ``clip(s, 1, 1) ≡ 1`` gives the peer term no
  gradient for the rest of the run (an ablation: a literal reading of the paper's iteration index, which stops the
  transfer; docs/methods.md).
- **Row order and mini-batches** (``row_order``): ``own_then_peer`` (default, as the public HACPO code, whose
  trainer puts the learner's own trajectories first and does not shuffle): ``R``'s own rows (in ``R``'s prompt
  order) split with ``split_rows`` into ``num_mini_batches``, exactly plain GRPO's mini-batches; then the peer rows
  (in ``R``'s prompt order, peers in delivery order within a prompt) in further mini-batches of the same size
  (``ceil(#peer rows / own mini-batch size)`` of them, near-equal). The pooled batch so takes more optimizer
  updates than GRPO — twice as many with one peer of the same group size (public code: batch 128, mini-batch 64:
  updates 0–1 own, 2–3 peer, with ``L_m`` 0.85 and 0.875 on the peer updates). ``interleaved`` *(ours, an
  option only)*: the pooled groups in ``R``'s prompt order, own rows first in each, split with ``split_rows``
  into ``num_mini_batches`` (every mini-batch mixes own and peer rows; GRPO's update count).

Flows: every peer response whose group pairs with one of ``R``'s groups (by group identity,
``regimes.base.pair_peer_groups``: a prompt twice in a batch is two pooled groups) is ``consumed``; the others
``no_own_group``.
Metrics: ``capability/<policy>`` (``P_k`` for ``R`` and each source), ``cap_ratio/<source>`` (clipped
``P_R / P_S``), ``L_m_first`` (``L_m`` of the step's first update), ``m`` (steps planned before this one),
``peer_responses``; the objective reports ``L_m`` (token-weighted over the step's updates), ``seq_ratio_mean``,
``self/clip_frac`` and ``peer/seq_ratio_mean``, ``peer/clip_frac_low`` (``s < L_m``), ``peer/clip_frac_high``
(``s > 1``) (token-weighted means over sequences), ``self/approx_kl`` (per-token k3 to ``π_R,old`` on own rows)
and ``kl`` when a reference is given. The plan's own metrics are one :class:`HACPOStats`.

Constructor arguments (``init_args`` of ``model.regime`` in a config): ``window`` (5), ``floor`` (1e-8), ``ratio_min`` (0.1),
``ratio_max`` (10), ``lower_start`` (0.8), ``lower_slope`` (0.025), ``alpha`` (1), ``self_clip_low`` (3e-4),
``self_clip_high`` (4e-4), ``log_ratio_clamp`` (10), ``eps`` (1e-6),
``lower_schedule`` (``update`` | ``step``), ``kl_peer_rows`` (False), ``row_order`` (``own_then_peer`` |
``interleaved``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch

from mutual_rl.algorithms.hacpo import capability_ratio, hacpo_advantages
from mutual_rl.regimes.base import (
    Regime,
    group_key,
    pair_peer_groups,
    register_regime,
    require_scores,
    split_rows,
)
from mutual_rl.regimes.crossing import cross_rollouts, receiver_prompt_ids
from mutual_rl.stats import prefixed
from mutual_rl.types import ScoredGroup, Scores, ScoringRequest, TrainingPlan, collate
from mutual_rl.update.objectives import HACPOObjective

LOWER_SCHEDULES = ("update", "step")
ROW_ORDERS = ("own_then_peer", "interleaved")

__all__ = ["HACPO", "HACPOStats", "own_then_peer_mini_batches"]


@dataclass(frozen=True)
class HACPOStats:
    """HACPO's statistics of a receiver's plan (``TrainingPlan.metrics``; logged as ``<receiver>/<name>``)."""

    capability: Mapping[str, float] = field(metadata=prefixed("capability/", key="<name>"))
    """Per policy (the receiver and each source): capability ``P_k``, its windowed success rate (fraction)."""
    L_m_first: float
    """``L_m``, the lower clip bound of the peer rows' sequence ratio, at the step's first update."""
    m: int
    """Count of the plans built for this receiver before this one (the ``m`` of ``lower_schedule: step``)."""
    peer_responses: int
    """Count of the peer responses (rows) pooled into the batch."""
    cap_ratio: Mapping[str, float] = field(metadata=prefixed("cap_ratio/", key="<source>"))
    """Per source: ``P_R / P_S`` clipped to ``[ratio_min, ratio_max]`` (a ratio)."""


def own_then_peer_mini_batches(num_own: int, num_peer: int, num_mini_batches: int) -> list[list[int]]:
    """Mini-batches of rows ``[own rows 0..num_own) + [peer rows num_own..num_own+num_peer)``: the own rows
    split into ``num_mini_batches`` (as plain GRPO), then the peer rows in ``ceil(num_peer / size)`` near-equal
    mini-batches with ``size = num_own / (own mini-batches)`` (the public HACPO code's order and count)."""
    own = split_rows(num_own, num_mini_batches) if num_own else []
    if not num_peer:
        return own
    size = num_own / len(own) if own else num_peer / max(1, num_mini_batches)
    peer = split_rows(num_peer, math.ceil(num_peer / size - 1e-9))
    return own + [[num_own + r for r in rows] for rows in peer]


@register_regime("hacpo")
class HACPO(Regime):
    """HACPO baseline regime (rules as implemented and deviations: module docstring).

    Args:
        window: steps in the capability rolling mean.
        floor: floor of each capability P_k.
        ratio_min, ratio_max: clip range of P_R / P_S.
        lower_start, lower_slope: L_m = min(1, lower_start + lower_slope · m).
        alpha: exponent of the stop-gradient factor of the peer term.
        self_clip_low, self_clip_high: clip range [1 − low, 1 + high] of the self sequence ratio.
        log_ratio_clamp: clamp of ℓ̄_R − ℓ̄_src before exp.
        eps: added to the pooled std.
        lower_schedule: what m counts in L_m: update (the optimizer update within the current training step,
            restarting at 0 every step, as the public HACPO code) or step (training steps so far; L_m reaches 1
            after (1 - lower_start) / lower_slope steps and the peer term then has no gradient).
        kl_peer_rows: apply the KL penalty (algorithm.kl_coef) to peer rows too (default: own rows only, as the
            public HACPO code).
        row_order: own_then_peer (the public code: own rows in GRPO's mini-batches, then the peer rows in further
            mini-batches of the same size) or interleaved (ours: pooled groups split into num_mini_batches).
    """

    subscribes = ("rollout", "reward")
    stats_type = HACPOStats

    def __init__(self, window: int = 5, floor: float = 1e-8, ratio_min: float = 0.1, ratio_max: float = 10.0,
                 lower_start: float = 0.8, lower_slope: float = 0.025, alpha: float = 1.0,
                 self_clip_low: float = 3e-4, self_clip_high: float = 4e-4, log_ratio_clamp: float = 10.0,
                 eps: float = 1e-6, lower_schedule: Literal["update", "step"] = "update",
                 kl_peer_rows: bool = False,
                 row_order: Literal["own_then_peer", "interleaved"] = "own_then_peer"):
        if row_order not in ROW_ORDERS:
            raise ValueError(f"hacpo: row_order={row_order!r} is not one of: {', '.join(ROW_ORDERS)}.")
        if lower_schedule not in LOWER_SCHEDULES:
            raise ValueError(f"hacpo: lower_schedule={lower_schedule!r} is not one of: {', '.join(LOWER_SCHEDULES)}.")
        if window < 1:
            raise ValueError(f"hacpo: window must be >= 1, got {window}")
        if not 0 < ratio_min <= ratio_max:
            raise ValueError(f"hacpo: need 0 < ratio_min <= ratio_max, got {ratio_min}, {ratio_max}")
        self.window, self.floor, self.ratio_min, self.ratio_max = int(window), floor, ratio_min, ratio_max
        self.eps = eps
        self.lower_schedule = lower_schedule
        #: the objective of every plan (L_m's m: the update index; lower_schedule step: lower_m0 = the plan's m);
        #: kl_coef / kl_kind are the algorithm's, filled in by the update
        self.objective = HACPOObjective(
            lower_start=lower_start, lower_slope=lower_slope, lower_m0=0,
            lower_per_update=0 if lower_schedule == "step" else 1, alpha=alpha, self_clip_low=self_clip_low,
            self_clip_high=self_clip_high, log_ratio_clamp=log_ratio_clamp, kl_peer_rows=bool(kl_peer_rows))
        self.row_order = row_order
        self.windows: dict[str, list[tuple[int, float]]] = {}
        self.updates: dict[str, int] = {}

    # ---------------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        return {"windows": {k: [list(e) for e in v] for k, v in self.windows.items()}, "updates": dict(self.updates)}

    def load_state_dict(self, state: dict) -> None:
        self.windows = {k: [(int(s), float(r)) for s, r in v] for k, v in state.get("windows", {}).items()}
        self.updates = {k: int(v) for k, v in state.get("updates", {}).items()}

    def request(self, receiver, own, peers) -> ScoringRequest:
        """Each observed policy's positive-reward count and response count this step (the receiver first, then every
        delivered source), summed over every process, and the step of its first rollout (maximum over processes; -1
        for none): so the capability windows are over all ranks' groups and identical on every rank."""
        sums: list[float] = []
        maxes: list[int] = []
        for groups in (own, *peers.values()):
            rewards = torch.cat([g.rewards for g in groups]) if groups else torch.zeros(0)
            sums += [float((rewards > self.success_threshold).sum()), float(rewards.numel())]
            maxes.append(int(groups[0].rollouts[0].step) if groups and groups[0].rollouts else -1)
        return ScoringRequest(sums=tuple(sums), maxes=tuple(maxes), state=(receiver.name, *peers))

    def observe(self, policy: str, positive: float, total: float, step: int) -> None:
        """Add ``policy``'s positive-reward rate of ``step`` (``positive / total``, over every process) to its
        window; a policy with no response this step keeps its window."""
        if total == 0:
            return
        rate = positive / total
        win = self.windows.setdefault(policy, [])
        if win and win[-1][0] == step:
            win[-1] = (step, rate)
        else:
            win.append((step, rate))
        del win[: max(0, len(win) - self.window)]

    def takes(self, group: ScoredGroup) -> tuple[int, dict[str, int]]:
        """As GRAFT's cross rule (§6.3), what HACPO uses of a chosen peer group: all of it (pooled whole)."""
        return len(group.rollouts), {}

    def capability(self, policy: str) -> float:
        """``P_k``: mean of the window (floored); the floor if nothing was observed."""
        win = self.windows.get(policy, [])
        mean = sum(r for _, r in win) / len(win) if win else 0.0
        return max(mean, self.floor)

    # ----------------------------------------------------------------------------------------------- plan
    def plan(self, receiver, own, peers, num_mini_batches, scores: Scores | None = None):
        """``scores`` answers :meth:`request`, which may have seen more peer groups than ``peers`` pools: GRAFT's
        "HACPO rule" pools only the prompts GRAFT selects but measures capability on every delivered group."""
        name = receiver.name
        scores = require_scores(self, scores)
        for i, policy in enumerate(scores.state):
            self.observe(policy, scores.sums[2 * i], scores.sums[2 * i + 1], scores.maxes[i])
        p_r = self.capability(name)
        ratio = {src: capability_ratio(p_r, self.capability(src), self.floor, self.ratio_min, self.ratio_max)
                 for src in peers}
        m = self.updates.get(name, 0)  # training steps planned so far (lower_schedule "step")
        self.updates[name] = m + 1
        objective = dataclasses.replace(self.objective, lower_m0=m) if self.lower_schedule == "step" \
            else self.objective

        pairing = pair_peer_groups(own, peers)
        prompt_ids = receiver_prompt_ids(own)
        rows, advs, peer_flags, src_mean, caps, all_crossed = [], [], [], [], [], []
        for g in own:
            pooled = [(None, g)] + pairing.by_own.get(group_key(g), [])
            rewards = torch.cat([pg.rewards.float() for _, pg in pooled])
            r_of = torch.cat([torch.full((len(pg.rollouts),), 1.0 if s is None else ratio[s]) for s, pg in pooled])
            own_mask = torch.zeros(len(rewards), dtype=torch.bool)
            own_mask[: len(g.rollouts)] = True
            adv = hacpo_advantages(rewards, r_of, own_mask, self.eps) if len(rewards) else rewards
            advs.append(adv)
            for s, pg in pooled:
                if s is None:
                    rows += list(pg.rollouts)
                    src_mean += [0.0] * len(pg.rollouts)
                else:
                    crossed = cross_rollouts(receiver, pg.rollouts, prompt_ids)
                    rows += crossed
                    all_crossed += crossed
                    src_mean += [float(r.logp.double().sum() / max(r.logp.numel(), 1)) for r in pg.rollouts]
                peer_flags += [s is not None] * len(pg.rollouts)
            caps.append(r_of)
        adv_all, cap_all = torch.cat(advs), torch.cat(caps)
        if self.row_order == "own_then_peer":  # a stable reorder: own rows, then peer rows, each in prompt order
            order = [i for i, p in enumerate(peer_flags) if not p] + [i for i, p in enumerate(peer_flags) if p]
            rows, src_mean, peer_flags = [rows[i] for i in order], [src_mean[i] for i in order], \
                [peer_flags[i] for i in order]
            adv_all, cap_all = adv_all[order], cap_all[order]
            n_peer = sum(peer_flags)
            mini_batches = own_then_peer_mini_batches(len(rows) - n_peer, n_peer, num_mini_batches)
        else:
            mini_batches = split_rows(len(rows), num_mini_batches)
        batch = collate(
            rows, adv_all, receiver.tokenizer.pad_token_id, is_peer=peer_flags,
            needs_old_logp=[False] * len(rows),
            source_mean_logp=torch.tensor(src_mean, dtype=torch.float32), cap_ratio=cap_all,
        )
        metrics = HACPOStats(capability={name: p_r, **{src: self.capability(src) for src in peers}},
                             L_m_first=objective.lower(0), m=m, peer_responses=sum(peer_flags),
                             cap_ratio={src: ratio[src] for src in peers})
        return TrainingPlan(batch, mini_batches, metrics=metrics, flows=pairing.flows(),
                            objective=objective, crossed=all_crossed)
