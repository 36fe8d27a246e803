"""GRAFT's selection -- which of the receiver's groups take a peer's group, and from which source -- its per-step
statistics record and the accounting of every delivered peer response (regimes/graft.py's module docstring, steps
1-3 and "Flows"). Under any update rule (GRAFT's own how, or §6.3's cross rules) the selection is this module's."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from mutual_rl.names import DropReason
from mutual_rl.regimes.hacpo import HACPOStats
from mutual_rl.regimes.sgt import SGTStats
from mutual_rl.stats import prefixed
from mutual_rl.types import ScoredGroup


@dataclass(frozen=True)
class GraftStats:
    """GRAFT's statistics of a receiver's plan (``TrainingPlan.metrics``; logged as ``<receiver>/<name>``).

    The selection's fields (``candidates`` to ``transferred_responses``) are there under every update rule;
    those of GRAFT's own how (``admitted_frac`` to ``gate``) are ``None`` under a cross rule (``update_rule``
    hacpo / sgt), whose own record is ``rule``."""

    candidates: Mapping[str, int] = field(metadata=prefixed("candidates/", key="<source>"))
    """Per source ``S``: count of the receiver's groups in ``C_{S→R}`` (``k_R = 0``, ``1 ≤ k_S < n``)."""
    candidates_reverse: Mapping[str, int] = field(metadata=prefixed("candidates_reverse/", key="<source>"))
    """Per source ``S``: count of ``S``'s groups in the reverse direction ``C_{R→S}``."""
    selected: Mapping[str, int] = field(metadata=prefixed("selected/", key="<source>"))
    """Per source: count of its candidate groups kept after balancing."""
    rescued_by: Mapping[str, int] = field(metadata=prefixed("rescued/", key="<source>"))
    """Per source: count of the receiver's failed groups replaced by its group (cross rule: trained with)."""
    transferred_responses_by: Mapping[str, int] = field(metadata=prefixed("transferred_responses/", key="<source>"))
    """Per source: count of its responses transferred (admitted; hacpo rule: whole groups; sgt: one each)."""
    transferred_groups: int
    """Count of the receiver's groups replaced (GRAFT's how: those with an admitted row), over all sources."""
    transferred_responses: int
    """Count of the peer responses transferred, over all sources."""
    admitted_frac: float | None = None
    """Fraction of the evaluated peer responses admitted by the gate (0 when none was evaluated)."""
    evaluated_success: int | None = None
    """Count of the evaluated peer responses that are successes."""
    evaluated_failure: int | None = None
    """Count of the evaluated peer responses that are failures."""
    admitted_success: int | None = None
    """Count of the admitted peer responses that are successes."""
    admitted_failure: int | None = None
    """Count of the admitted peer responses that are failures."""
    admitted_frac_success: float | None = None
    """Fraction of the evaluated peer successes admitted (``None``: none was evaluated)."""
    admitted_frac_failure: float | None = None
    """Fraction of the evaluated peer failures admitted (``None``: none was evaluated)."""
    compat_s_mean: float | None = None
    """Mean compatibility score ``s`` of the evaluated peer responses (``None``: none was evaluated)."""
    compat_s_min: float | None = None
    """Smallest compatibility score ``s`` of the evaluated peer responses (``None``: none was evaluated)."""
    compat_s_max: float | None = None
    """Largest compatibility score ``s`` of the evaluated peer responses (``None``: none was evaluated)."""
    gate: Mapping[str, float] | None = field(default=None, metadata=prefixed("gate/", key="<stat>"))
    """Gate grid (``graft_gate.gate_grid``): per outcome, fraction admitted per δ and quantiles of ``s``."""
    rule: SGTStats | HACPOStats | None = field(default=None, metadata=prefixed(""))
    """A cross rule's own record (logged by its own names); ``None`` under GRAFT's own how."""


def successes(group: ScoredGroup, threshold: float) -> int:
    """How many of the group's responses have a reward above ``threshold``."""
    return int((group.rewards > threshold).sum())


def candidate_prompts(
    receiver: Mapping[Hashable, ScoredGroup], source: Mapping[Hashable, ScoredGroup], success_threshold: float = 0.0
) -> dict[Hashable, int]:
    """``C_{S→R}`` as ``{key: k_S(q)}``: ``k_R(q) = 0`` and ``1 ≤ k_S(q) < n_S(q)``; both mappings are keyed
    the same way (the trainer keys by the receiver's group identity, ``regimes.base.group_key``)."""
    out = {}
    for q, g in source.items():
        if q not in receiver or successes(receiver[q], success_threshold) != 0:
            continue
        k = successes(g, success_threshold)
        if 1 <= k < len(g.rollouts):
            out[q] = k
    return out


def balanced_candidates(candidates: Mapping[int, int], reverse_count: int) -> set[int]:
    """Keep the first ``m = min(|C|, reverse_count)`` candidates by ``k`` descending plus boundary ties."""
    m = min(len(candidates), reverse_count)
    if m == 0:
        return set()
    cutoff = sorted(candidates.values(), reverse=True)[m - 1]
    return {q for q, k in candidates.items() if k >= cutoff}


@dataclass(frozen=True)
class Selection:
    """Steps 1-3 of one plan: per source its candidate receiver groups (``key -> k_S``), the size of its
    reverse candidate set and the groups kept after balancing; the source chosen for each receiver group."""

    candidates: dict[str, dict]
    reverse: dict[str, int]
    kept: dict[str, set]
    chosen: dict


def select(own_by, peer_by, order, thr: float, balance: bool) -> Selection:
    """Steps 1-3: candidates per source (successes: reward > ``thr``), balancing (``balance``), and one source per
    receiver group (N > 2: highest ``k_S``, then ``order``)."""
    rank = {src: i for i, src in enumerate(order)}
    cands, reverse, kept = {}, {}, {}
    for src in order:
        cands[src] = candidate_prompts(own_by, peer_by[src], thr)
        reverse[src] = len(candidate_prompts(peer_by[src], own_by, thr))
        kept[src] = balanced_candidates(cands[src], reverse[src]) if balance else set(cands[src])
    chosen: dict = {}  # receiver group key -> source, highest k_S then policy order
    for src in order:
        for q in kept[src]:
            best = chosen.get(q)
            if best is None or (cands[src][q], -rank[src]) > (cands[best][q], -rank[best]):
                chosen[q] = src
    return Selection(cands, reverse, kept, chosen)


def selection_stats(selection: Selection, order) -> dict:
    """The selection's per-source counts (fields of :class:`GraftStats`), sources in ``order``."""
    return dict(candidates={src: len(selection.candidates[src]) for src in order},
                candidates_reverse={src: selection.reverse[src] for src in order},
                selected={src: len(selection.kept[src]) for src in order})


def flows(peers, pairing, peer_by, selection: Selection, dropped) -> dict[str, dict[str, int]]:
    """Every delivered peer response, consumed or dropped with its reason (regimes/graft.py, "Flows")."""
    out: dict[str, dict[str, int]] = {}
    for src in peers:
        f: dict[str, int] = {}
        items = [(q, g, None) for q, g in peer_by.get(src, {}).items()]
        items += [(None, g, DropReason.NO_OWN_GROUP) for g in pairing.unmatched.get(src, [])]
        for q, g, fixed in items:
            n = len(g.rollouts)
            if fixed is not None:
                reason = {fixed: n}
            elif q not in selection.candidates[src]:
                reason = {DropReason.NOT_CANDIDATE: n}
            elif q not in selection.kept[src]:
                reason = {DropReason.UNBALANCED: n}
            elif selection.chosen[q] != src:
                reason = {DropReason.OTHER_SOURCE: n}
            else:
                reason = {"consumed": n - sum(dropped[src][q].values()), **dropped[src][q]}
            for k, v in reason.items():
                f[k] = f.get(k, 0) + v
        out[src] = {k: v for k, v in f.items() if v}
    return out
