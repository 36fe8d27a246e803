"""GRAFT: Gated Replacement of Answer-Failed groups with peer Trajectories (docs/methods.md §5.5;
GRAFT, arXiv 2609.37868, §4).

As implemented, for a receiver ``R`` and each source ``S`` (success = ``reward > success_threshold``,
``k_p(q)`` = successes of ``p``'s group for prompt ``q``, ``n`` = the source group's size):

1. **Which.** Candidates ``C_{S→R} = { q : k_R(q) = 0 ∧ 1 ≤ k_S(q) < n }`` (a group of size 1 is never a
   candidate; neither is an all-pass or all-fail source group).
2. **Balance** (``balance=True``): ``m = min(|C_{S→R}|, |C_{R→S}|)`` — the receiver computes the reverse
   direction ``C_{R→S}`` from its own and ``S``'s groups, so the rule is a pure function of this step's groups
   and both policies reach the same ``m``. Candidates are ranked by ``k_S(q)`` descending and the first ``m`` are
   kept together with every candidate tied with the ``m``-th (i.e. all ``q`` with ``k_S(q) ≥ k_(m)``); none if
   ``m = 0``. ``balance=False`` keeps every candidate (stored-peer mode, paper §6.2).
3. **N > 2** *(ours)*: balancing is pairwise (``R`` with each ``S`` separately, on the raw candidate sets);
   then, per prompt, among the sources whose *balanced* candidate set holds ``q``, ``R`` takes the one with the
   highest ``k_S(q)``, ties broken by policy order (``policy_order`` if given — sources it does not name follow
   in delivery order — else the order of the ``peers`` mapping).
4. **How.** The selected source group is crossed into ``R``'s tokenization as text (THL, no trace alignment)
   and replaces ``R``'s failed group **whole** (successes and failures), each response keeping its
   **source-computed advantage** (never renormalised). Per response, compatibility
   ``s = exp(ℓ̄(π_R,old, o^R) − ℓ̄(π_S, o^S))`` with ``ℓ̄`` the mean token log-prob, each side in its own
   tokenization: ``ℓ̄(π_S, o^S)`` = mean of the source's sampled trace (``Rollout.logp``, EOS included);
   ``ℓ̄(π_R,old, o^R)`` = mean over the crossed response tokens (receiver EOS included) of
   the receiver's log-probs at its sampling temperature, under ``no_grad`` before any update (requested; the step
   computes them).
   Weight ``w = 1[s > δ] · min(s, 1)``; responses with ``s ≤ δ`` are dropped. Those receiver log-probs are
   the grafted rows' ``old_logp`` (``needs_old_logp`` False): the token ratio's denominator is ``π_R,old``.
   *(ours)* If every response of a selected group falls below the floor, nothing is grafted for that prompt
   and ``R`` keeps its own (all-fail, zero-advantage) group, so a batch is never emptied.
   **Ablations** (the paper's): ``compatibility="off"`` — every evaluated response gets ``w = 1`` and none is
   dropped by the floor (``s`` is still computed: it is logged, and its receiver log-probs are the rows'
   ``old_logp``); ``transfer="successes"`` — only the selected group's successes (``k_S(q) ≥ 1`` of them) are
   crossed, evaluated and grafted, each with its source advantage, floor and weight as above; its failures are
   dropped (``not_success``). Candidates, balancing and the source choice are the same in every ablation.
5. **Objective**: token-mean DAPO (the base objective) with ``PolicyBatch.weights = w`` (own rows ``w = 1``).
6. **Peer-last** (``peer_last``). ``in_batch`` (default, the paper): the grafted groups replace ``R``'s failed
   groups *inside* the batch; the rows are ``R``'s remaining own groups in order, then the grafted groups (in
   ``R``'s prompt order), split with ``split_rows`` into ``num_mini_batches`` — the number and size of the
   mini-batches do not change with grafting when the source's group size equals the receiver's (a grafted group
   brings the source's rows, fewer when some fall below the floor; with different ``sampling.n`` the mini-batches
   follow the row count), and the mini-batches that hold grafted rows run last. ``none`` (ablation, no peer-last
   order): grafted groups stay where the replaced group was, then ``split_rows`` as ``in_batch``.
7. **Identity.** Groups are keyed by ``(prompt_id, group_id)`` (``regimes.base.pair_peer_groups``), never by the
   prompt id alone: a prompt that occurs twice in one step is two receiver groups, each a candidate of its own
   with the peers' group of the same slot.
8. **KL** (``algorithm.kl_coef > 0``): on every row of the batch, grafted rows included, against the reference's
   log-probs of ``R``'s tokens (the grafted responses are trained as ``R``'s tokens).

Flows (per source, in responses; they sum to the responses delivered): ``consumed`` (grafted, ``w > 0``),
``compat_below_floor`` (selected but ``s ≤ δ``), ``not_success`` (``transfer="successes"``: a failure of a
selected group), ``not_candidate`` (``q ∉ C_{S→R}``), ``unbalanced`` (cut by balancing), ``other_source``
(N > 2: another source chosen for ``q``), ``no_own_group`` (``R`` has no group for ``q``; not expected when peers
answer the receiver's prompts).

Metrics (``TrainingPlan.metrics``, a :class:`GraftStats`): per source
``candidates/<S>`` = ``|C_{S→R}|``, ``candidates_reverse/<S>`` =
``|C_{R→S}|``, ``selected/<S>`` (after balancing), ``rescued/<S>`` (``R``'s failed prompts replaced by ``S``'s
group), ``transferred_responses/<S>`` (admitted); overall ``transferred_groups``, ``transferred_responses``,
``admitted_frac`` (admitted / evaluated responses), ``compat_s_mean|min|max`` (when any response was evaluated),
and (``TrainingPlan.histograms``) ``compat_s``: a 1-D tensor of every evaluated ``s`` (possibly empty), logged as a
TensorBoard histogram ``<receiver>/compat_s``; and the gate split by the peer response's reward (does it admit mostly the peer's failures?):
``evaluated_success|failure``, ``admitted_success|failure`` (counts) and ``admitted_frac_success|failure``
(admitted / evaluated among the evaluated successes / failures; absent on a step that evaluated none of that
kind, so the log shows a gap); the same shares at every δ of ``regimes.graft_gate.GATE_DELTAS`` and quantiles of
``s`` per outcome (``gate/admit_<kind>@<δ>``, ``gate/s_p<q>_<kind>``), whatever the regime's own δ.

**Cross rules** (GRAFT §6.3: "applying either update rule to our selected prompts"; ``update_rule``): the
*which* of GRAFT (steps 1-3: candidates, balancing, the source per prompt) with another *how*:

- ``graft`` (default): steps 4-6 above.
- ``hacpo``: HACPO's update (``regimes/hacpo.py``, docs/methods.md §5.6) with the pooled groups restricted to the
  selected prompts: ``R``'s group for a selected ``q`` is pooled with the chosen source's whole group, every other
  prompt keeps ``R``'s own group alone (its HACPO advantage is then GRPO's); capability-weighted baseline,
  sequence-level ratios, the ``L_m`` peer clip, own rows first and peer rows in further mini-batches, HACPO's
  objective. The capability windows observe every delivered group, as HACPO's do. No compatibility
  weight, no source advantages. Flows: the chosen group ``consumed`` whole.
- ``sgt``: SGT's update (``regimes/sgt.py``, §5.4) on the selected prompts: ``R``'s own batch unchanged (DAPO) plus
  ``λ ·`` the NLL of one success drawn (seeded, uniformly) from the chosen source's group for each selected
  ``q``, weighed as SGT's own term (``λ ·`` the mean NLL of the rescued responses each update holds). Flows:
  the drawn success ``consumed``, the group's other successes ``not_drawn``, its failures ``not_success``.

``rule_args`` are the init arguments of that rule's regime (HACPO's or SGT's: e.g. ``{coef: 0.1}`` for SGT's λ);
``peer_last``, ``compatibility`` and ``transfer`` belong to GRAFT's own how and are refused with another rule.
Metrics: the selection's (``candidates/…``, ``candidates_reverse/…``, ``selected/…``, ``rescued/<S>``,
``transferred_groups``, ``transferred_responses``, ``transferred_responses/<S>``) and the rule's own
(HACPO: ``capability/…``, ``L_m_first``, …; SGT: ``rescued``, ``gate_rate``, ``all_fail_frac``); no
``compat_s`` (nothing is scored). With ``hacpo`` the regime's state is HACPO's (capability windows, step count).

Constructor arguments (``init_args`` of ``model.regime`` in a config): ``delta`` (δ, 0.8), ``balance`` (True;
False in stored-peer mode), ``policy_order`` (None), ``peer_last`` (``in_batch`` | ``none``),
``compatibility`` (``weighted`` | ``off``), ``transfer`` (``group`` | ``successes``), ``update_rule`` (``graft`` |
``hacpo`` | ``sgt``), ``rule_args`` (None); the ablation configs are ``configs/graft_no_peer_last.yaml``,
``graft_no_compat.yaml`` and ``graft_successes.yaml``, the cross rules ``configs/graft_hacpo_rule.yaml`` and
``graft_sgt_rule.yaml``.

The compatibility log-probs are asked for in ``request`` and computed by the step (``mutual_rl.step.scoring``: no-grad
forwards packed to ``algorithm.max_tokens_per_micro_batch``); the regime itself runs no model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from mutual_rl.names import DropReason
from mutual_rl.regimes.base import (
    PeerPairing,
    Regime,
    group_key,
    pair_peer_groups,
    register_regime,
    require_scores,
    split_rows,
)
from mutual_rl.regimes.crossing import cross_rollouts, receiver_prompt_ids
from mutual_rl.regimes.graft_gate import compatibility_score, compatibility_weight, gate_grid
from mutual_rl.regimes.graft_select import (
    GraftStats,
    Selection,
    balanced_candidates,
    candidate_prompts,
    select,
    selection_stats,
)
from mutual_rl.regimes.graft_select import flows as graft_flows
from mutual_rl.regimes.hacpo import HACPO
from mutual_rl.regimes.sgt import SGT, SGTStats
from mutual_rl.types import ScoredGroup, Scores, ScoringRequest, TrainingPlan, collate

PEER_LAST = ("in_batch", "none")
COMPATIBILITY = ("weighted", "off")
TRANSFER = ("group", "successes")
RULES = {"hacpo": HACPO, "sgt": SGT}
UPDATE_RULES = ("graft", *RULES)

__all__ = ["GRAFT", "GraftStats", "balanced_candidates", "candidate_prompts", "compatibility_score",
           "compatibility_weight"]


def _mean_logp(trace: torch.Tensor) -> float:
    return float(trace.double().sum() / max(trace.numel(), 1))


@dataclass(frozen=True)
class _Row:
    """One training row: a rollout (own, or crossed with the receiver's old log-probs), its advantage and weight."""

    rollout: object
    advantage: float
    weight: float
    is_peer: bool


@dataclass(frozen=True)
class _Grafted:
    """A receiver group replaced by a source's crossed responses (the admitted ones, ``w > 0``)."""

    key: tuple
    source: str
    rows: list[_Row]


@dataclass(frozen=True)
class _Selected:
    """Steps 1-3 of one plan: the receiver's groups by key, the pairing, the source order, each source's paired
    groups by receiver key, and the selection."""

    own_by: dict
    pairing: PeerPairing
    order: list[str]
    peer_by: dict[str, dict]
    selection: Selection


@dataclass(frozen=True)
class _Crossing:
    """Step 4's input: per selected receiver group ``(key, source, response indices)`` and its crossed responses."""

    selected: list[tuple]
    crossed: list[list]


@dataclass(frozen=True)
class _Graft:
    """Step 4 of one plan: the grafted groups in the receiver's group order, the per-source, per-group drop counts
    (``{src: {key: {reason: n}}}``), the evaluated ``s`` per group, the evaluated / admitted counts split by the
    peer response's reward, and every crossed response."""

    groups: list[_Grafted]
    dropped: dict[str, dict]
    scores: list[torch.Tensor]
    successes: list[bool]  # per evaluated response, in the order of ``scores``: was it a success
    split: dict[str, int]
    crossed: list


@register_regime("graft")
class GRAFT(Regime):
    """GRAFT regime (see the module docstring for the rules as implemented and every deviation).

    Args:
        delta: compatibility floor δ; responses with s ≤ δ are dropped.
        balance: balance the transfer volume across directions (False in stored-peer mode).
        policy_order: tie-break order of sources for N > 2 (default: order of the delivered peers).
        peer_last: in_batch (the paper: grafted groups replace the receiver's inside the batch and the
            mini-batches holding them run last; number and size of mini-batches unchanged) | none (grafted groups
            stay in the receiver's prompt order; ablation).
        compatibility: weighted (the paper: w = 1[s > delta] * min(s, 1)) | off (ablation: every grafted
            response gets w = 1 and none is dropped by the floor; s is still computed and logged).
        transfer: group (the paper: the source group whole, successes and failures) | successes (ablation: only
            the source group's successes, each with its source advantage; failures dropped as not_success).
        update_rule: graft (the paper's how) | hacpo | sgt (GRAFT §6.3: HACPO's or SGT's update rule applied to
            the prompts GRAFT selects).
        rule_args: init arguments of the hacpo / sgt rule's regime (e.g. {coef: 0.1} for SGT's λ).
    """

    subscribes = ("rollout", "reward", "advantage")
    stats_type = GraftStats

    def __init__(self, delta: float = 0.8, balance: bool = True, policy_order: list[str] | None = None,
                 peer_last: Literal["in_batch", "none"] = "in_batch",
                 compatibility: Literal["weighted", "off"] = "weighted",
                 transfer: Literal["group", "successes"] = "group",
                 update_rule: Literal["graft", "hacpo", "sgt"] = "graft", rule_args: dict | None = None):
        for name, value, choices in (("peer_last", peer_last, PEER_LAST),
                                     ("compatibility", compatibility, COMPATIBILITY),
                                     ("transfer", transfer, TRANSFER),
                                     ("update_rule", update_rule, UPDATE_RULES)):
            if value not in choices:
                raise ValueError(f"graft: {name}={value!r} is not one of: {', '.join(choices)}.")
        self.update_rule = update_rule
        self._rule: HACPO | SGT | None = None  # the cross rule's regime (None: GRAFT's own how)
        if update_rule == "graft":
            if rule_args:
                raise ValueError(f"graft: rule_args={rule_args!r} applies to update_rule hacpo or sgt only; remove "
                                 "it or set update_rule.")
        else:
            own_how = [f"{n}={v!r}" for n, v, d in (("peer_last", peer_last, "in_batch"),
                                                     ("compatibility", compatibility, "weighted"),
                                                     ("transfer", transfer, "group")) if v != d]
            if own_how:
                raise ValueError(f"graft: {', '.join(own_how)} belongs to GRAFT's own update rule and does not apply "
                                 f"with update_rule={update_rule!r}; remove it.")
            try:
                self._rule = RULES[update_rule](**dict(rule_args or {}))
            except TypeError as e:
                raise ValueError(f"graft: rule_args={rule_args!r} are not arguments of the {update_rule} rule: {e}") \
                    from None
        self.peer_last, self.compatibility, self.transfer = peer_last, compatibility, transfer
        if delta < 0:
            raise ValueError(f"graft: delta must be >= 0, got {delta}")
        self.delta = float(delta)
        self.balance = bool(balance)
        self.policy_order = list(policy_order) if policy_order is not None else None

    def state_dict(self) -> dict:
        return {"rule": self._rule.state_dict()} if self._rule is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self._rule is not None and "rule" in state:
            self._rule.load_state_dict(state["rule"])

    def _source_order(self, peers: Mapping[str, Sequence[ScoredGroup]]) -> list[str]:
        names = list(peers)
        if self.policy_order is None:
            return names
        rank = {n: i for i, n in enumerate(self.policy_order)}
        return sorted(names, key=lambda n: (rank.get(n, len(rank)), names.index(n)))

    def _select(self, own, peers) -> _Selected:
        """Steps 1-3 (no model): candidates, balancing, one source per receiver group."""
        own_by = {group_key(g): g for g in own}
        pairing = pair_peer_groups(own, peers)
        order = self._source_order(peers)
        peer_by: dict[str, dict] = {src: {} for src in order}  # source -> receiver group key -> its group
        for key, pairs in pairing.by_own.items():
            for src, g in pairs:
                peer_by[src][key] = g
        return _Selected(own_by, pairing, order, peer_by,
                         select(own_by, peer_by, order, self.success_threshold, self.balance))

    def request(self, receiver, own, peers) -> ScoringRequest:
        """GRAFT's own how: the receiver's log-probs of every crossed response of the chosen groups (step 4). A
        cross rule: what that rule asks for on every delivered group (HACPO's capability counts)."""
        own = [g for g in own if g.rollouts]
        sel = self._select(own, peers)
        if self._rule is not None:
            self._rule.success_threshold = self.success_threshold  # what the rule counts as a success, before it counts
            inner = self._rule.request(receiver, own, peers)
            return dataclasses.replace(inner, state=(sel, inner.state))
        crossing = self._cross(receiver, own, sel)
        return ScoringRequest(rows=tuple(c for cs in crossing.crossed for c in cs), state=(sel, crossing))

    def plan(self, receiver, own, peers, num_mini_batches, scores: Scores | None = None):
        sel, inner = require_scores(self, scores).state
        own = [g for g in own if g.rollouts]
        if self._rule is not None:
            return self._cross_rule(receiver, own, peers, sel, dataclasses.replace(scores, state=inner),
                                    num_mini_batches)
        graft = self._graft(sel.peer_by, inner, list(scores.logp))
        flows = graft_flows(peers, sel.pairing, sel.peer_by, sel.selection, graft.dropped)
        batch, mini_batches = self._assemble(receiver, own, graft.groups, num_mini_batches)
        n_peer = int(batch.is_peer.sum())
        s_all = torch.cat(graft.scores).float() if graft.scores else torch.zeros(0)
        split = graft.split  # the gate's evaluations and admissions by the peer response's reward
        evaluated = split["evaluated_success"] + split["evaluated_failure"]
        frac = {kind: split[f"admitted_{kind}"] / n if (n := split[f"evaluated_{kind}"]) else None
                for kind in ("success", "failure")}
        grid = gate_grid(s_all, torch.tensor(graft.successes, dtype=torch.bool)) if evaluated else None
        order = sel.order
        metrics = GraftStats(
            **selection_stats(sel.selection, order),
            rescued_by={src: sum(1 for g in graft.groups if g.source == src) for src in order},
            transferred_responses_by={src: sum(len(g.rows) for g in graft.groups if g.source == src)
                                      for src in order},
            transferred_groups=len(graft.groups), transferred_responses=n_peer,
            admitted_frac=n_peer / evaluated if evaluated else 0.0,
            evaluated_success=split["evaluated_success"], evaluated_failure=split["evaluated_failure"],
            admitted_success=split["admitted_success"], admitted_failure=split["admitted_failure"],
            admitted_frac_success=frac["success"], admitted_frac_failure=frac["failure"],
            compat_s_mean=float(s_all.mean()) if evaluated else None,
            compat_s_min=float(s_all.min()) if evaluated else None,
            compat_s_max=float(s_all.max()) if evaluated else None,
            gate={k.removeprefix("gate/"): v for k, v in grid.items()} if grid is not None else None,
        )
        return TrainingPlan(batch, mini_batches, metrics=metrics, flows=flows, crossed=graft.crossed,
                            histograms={"compat_s": s_all})

    def _cross_rule(self, receiver, own, peers, sel: _Selected, scores: Scores, num_mini_batches) -> TrainingPlan:
        """GRAFT §6.3: HACPO's or SGT's update on the selected prompts (module docstring, "Cross rules"). The
        rule's ``takes`` says how much of a chosen group it uses; its ``scores`` are what it asked for on every
        delivered group."""
        rule, thr = self._rule, self.success_threshold
        rule.success_threshold = thr
        selected: dict[str, list[ScoredGroup]] = {src: [] for src in peers}
        dropped: dict[str, dict] = {src: {} for src in sel.peer_by}
        transferred = dict.fromkeys(sel.order, 0)
        for g in own:
            q = group_key(g)
            if q not in sel.selection.chosen:
                continue
            src = sel.selection.chosen[q]
            pg = sel.peer_by[src][q]
            # keyed to the receiver group it was paired with, so the rule pairs it with that group again
            selected[src].append(dataclasses.replace(pg, group_id=q[1]))
            used, dropped[src][q] = rule.takes(pg)
            transferred[src] += used
        sub = rule.plan(receiver, own, selected, num_mini_batches, scores)
        rule_stats = sub.metrics
        if isinstance(rule_stats, SGTStats):
            # SGT's rescued/<source> are GRAFT's names too, and GRAFT's counts win (as they did when the
            # rule's metrics dict was updated with GRAFT's): the nested SGT record leaves its own out.
            # HACPO's names (capability/, cap_ratio/, L_m_first, m, peer_responses) meet none of GRAFT's.
            rule_stats = dataclasses.replace(rule_stats, rescued_by={})
        metrics = GraftStats(
            **selection_stats(sel.selection, sel.order),
            rescued_by={src: len(selected.get(src, [])) for src in sel.order},
            transferred_responses_by=transferred,
            transferred_groups=len(sel.selection.chosen), transferred_responses=sum(transferred.values()),
            rule=rule_stats,
        )
        flows = graft_flows(peers, sel.pairing, sel.peer_by, sel.selection, dropped)
        return dataclasses.replace(sub, metrics=metrics, flows=flows)

    def _cross(self, receiver, own, sel: _Selected) -> _Crossing:
        """Step 4's crossing: every chosen group (its successes only with ``transfer="successes"``) in the
        receiver's tokenization."""
        thr, chosen = self.success_threshold, sel.selection.chosen
        selected = []  # (key, source, indices of the responses to cross)
        for q in sel.own_by:
            if q in chosen:
                g = sel.peer_by[chosen[q]][q]
                ok = (g.rewards > thr).tolist()
                idx = [i for i in range(len(g.rollouts)) if self.transfer == "group" or ok[i]]
                selected.append((q, chosen[q], idx))
        prompt_ids = receiver_prompt_ids(own)
        return _Crossing(selected, [cross_rollouts(receiver, [sel.peer_by[src][q].rollouts[i] for i in idx],
                                                   prompt_ids) for q, src, idx in selected])

    def _graft(self, peer_by, crossing: _Crossing, r_logp: list[torch.Tensor]) -> _Graft:
        """Step 4: each crossed response's compatibility from the receiver's log-probs ``r_logp`` (one per crossed
        row, in order); keep ``w > 0``."""
        thr = self.success_threshold
        flat = [c for cs in crossing.crossed for c in cs]
        all_s: list[torch.Tensor] = []
        all_ok: list[bool] = []
        grafted = []
        dropped: dict[str, dict] = {src: {} for src in peer_by}
        split = dict.fromkeys(("evaluated_success", "evaluated_failure", "admitted_success", "admitted_failure"), 0)
        pos = 0
        for (q, src, idx), cs in zip(crossing.selected, crossing.crossed):
            g = peer_by[src][q]
            traces = r_logp[pos : pos + len(cs)]
            pos += len(cs)
            r_mean = torch.tensor([_mean_logp(t) for t in traces], dtype=torch.float64)
            s_mean = torch.tensor([_mean_logp(g.rollouts[i].logp) for i in idx], dtype=torch.float64)
            all_s.append(compatibility_score(r_mean, s_mean))
            if self.compatibility == "weighted":
                w = compatibility_weight(r_mean, s_mean, self.delta)
            else:  # ablation: no compatibility weight, no floor
                w = torch.ones(len(idx), dtype=torch.float64)
            adv, success = g.advantages.tolist(), (g.rewards > thr).tolist()
            all_ok += [bool(success[i]) for i in idx]
            rows = []
            for c, t, i, wi in zip(cs, traces, idx, w.tolist()):
                kind = "success" if success[i] else "failure"
                split[f"evaluated_{kind}"] += 1
                if wi > 0:
                    split[f"admitted_{kind}"] += 1
                    rows.append(_Row(dataclasses.replace(c, old_logp=t), float(adv[i]), float(wi), True))
            if rows:
                grafted.append(_Grafted(q, src, rows))
            dropped[src][q] = {DropReason.COMPAT_BELOW_FLOOR: len(cs) - len(rows),
                               DropReason.NOT_SUCCESS: len(g.rollouts) - len(cs)}
        return _Graft(grafted, dropped, all_s, all_ok, split, flat)

    def _assemble(self, receiver, own, grafted: list[_Grafted], num_mini_batches):
        """Steps 5-6: the batch (own rows ``w = 1``, grafted rows with their ``w``) and its mini-batches."""
        replaced = {g.key: g.rows for g in grafted}
        own_rows, peer_rows, in_place = [], [], []
        for g in own:
            q = group_key(g)
            if q in replaced:
                peer_rows += replaced[q]
                in_place += replaced[q]
            else:
                mine = [_Row(r, float(a), 1.0, False) for r, a in zip(g.rollouts, g.advantages.tolist())]
                own_rows += mine
                in_place += mine
        rows = in_place if self.peer_last == "none" else own_rows + peer_rows
        batch = collate(
            [r.rollout for r in rows], [r.advantage for r in rows], receiver.tokenizer.pad_token_id,
            weights=[r.weight for r in rows], is_peer=[r.is_peer for r in rows], needs_old_logp=[False] * len(rows),
        )
        return batch, split_rows(len(rows), num_mini_batches)  # the paper: same mini-batches, grafted ones last
