"""Sharing regimes: one interface, one registry.

A receiver's regime is a pure transform from (its own scored groups, the peers' scored groups for the same
prompts, the answers to what it requested) to that policy's training plan: the rows to train on and the order of
its mini-batches. What needs a model or the other processes -- the receiver's log-probs of crossed peer text,
counts summed over ranks -- a regime asks for in ``request`` and the step computes (``mutual_rl.step.scoring``).
Regimes are not callbacks (docs/design.md, "Decisions"); anything that crosses tokenizers goes through the THL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from mutual_rl.interfaces import Regime
from mutual_rl.names import DropReason
from mutual_rl.types import PolicyBatch, ScoredGroup, Scores, TrainingPlan, collate

_REGIMES: dict[str, Callable[..., Regime]] = {}


def register_regime(name: str):
    def deco(cls):
        if name in _REGIMES:
            raise ValueError(f"regime {name!r} is already registered")
        _REGIMES[name] = cls
        return cls

    return deco


def require_scores(regime: Regime, scores: Scores | None) -> Scores:
    """``scores``, or the error that says how to plan a regime that asks for something before it plans."""
    if scores is None:
        name = type(regime).__name__
        raise TypeError(f"{name}.plan needs the answers to its request (the receiver's log-probs of crossed peer "
                        f"responses, or counts over every process): plan it with mutual_rl.step.scoring.plan_regime("
                        f"regime, receiver, own, peers, num_mini_batches), as the training step does.")
    return scores


def split_rows(num_rows: int, num_mini_batches: int) -> list[list[int]]:
    """Contiguous, near-equal mini-batches of ``range(num_rows)`` (groups stay together when sizes divide)."""
    k = max(1, min(num_mini_batches, num_rows))
    bounds = torch.linspace(0, num_rows, k + 1).round().long().tolist()
    return [list(range(bounds[i], bounds[i + 1])) for i in range(k) if bounds[i + 1] > bounds[i]]


def own_batch(receiver, own: Sequence[ScoredGroup]) -> PolicyBatch:
    rollouts = [r for g in own for r in g.rollouts]
    adv = torch.cat([g.advantages for g in own])
    return collate(rollouts, adv, receiver.tokenizer.pad_token_id)


GroupKey = tuple  # (prompt_id, group_id): the identity of one of the receiver's groups this step


def group_key(group: ScoredGroup) -> GroupKey:
    """The identity of a group within a step: ``(prompt_id, group_id)``, never the prompt id alone."""
    return (group.prompt_id, group.group_id)


@dataclass
class PeerPairing:
    """Which receiver group each delivered peer group answers.

    ``by_own[key]`` lists ``(source, group)`` for the receiver's group ``key`` (sources in the ``peers`` mapping
    order, at most one group per source); ``unmatched[source]`` lists that source's groups that answer no group
    of the receiver (dropped ``no_own_group`` by every regime).
    """

    by_own: dict[GroupKey, list[tuple[str, ScoredGroup]]]
    unmatched: dict[str, list[ScoredGroup]]

    def flows(self, used: str = "consumed") -> dict[str, dict[str, int]]:
        """Flows when every paired peer response is ``used`` and every unmatched one ``no_own_group``."""
        out: dict[str, dict[str, int]] = {}
        for pairs in self.by_own.values():
            for src, g in pairs:
                out.setdefault(src, {})
                out[src][used] = out[src].get(used, 0) + len(g.rollouts)
        for src, gs in self.unmatched.items():
            out.setdefault(src, {})
            n = sum(len(g.rollouts) for g in gs)
            if n:
                out[src][DropReason.NO_OWN_GROUP] = out[src].get(DropReason.NO_OWN_GROUP, 0) + n
        return {src: {k: v for k, v in f.items() if v} for src, f in out.items()}


def pair_peer_groups(own: Sequence[ScoredGroup], peers: Mapping[str, Sequence[ScoredGroup]]) -> PeerPairing:
    """Pair every delivered peer group with the receiver group it answers, by group identity.

    A prompt can occur twice in one step (the prompt stream wraps around an epoch boundary when the training set
    is not a multiple of the global batch, or a prompt file repeats a problem), so a prompt id alone does not name
    a group. The rule: a peer group pairs with the receiver group of the same ``(prompt_id, group_id)`` (live
    co-training: every policy answers the same stream slot under the same group id); failing that, with the
    first receiver group of the same prompt id that this source has not answered yet, in the receiver's order
    (recorded traffic whose group ids differ). Each receiver group gets at most one group per source; a peer
    group left over (its prompt is not in the receiver's batch, or this source answered it more often than the
    receiver did) is unmatched. Empty groups (no rollouts) are ignored.
    """
    own = [g for g in own if g.rollouts]
    keys = [group_key(g) for g in own]
    by_own: dict[GroupKey, list[tuple[str, ScoredGroup]]] = {k: [] for k in keys}
    unmatched: dict[str, list[ScoredGroup]] = {}
    for src, groups in peers.items():
        taken: set = set()
        pending = []
        for g in groups:
            if not g.rollouts:
                continue
            k = group_key(g)
            if k in by_own and k not in taken:
                taken.add(k)
                by_own[k].append((src, g))
            else:
                pending.append(g)
        unmatched[src] = []
        for g in pending:
            k = next((k for k in keys if k[0] == g.prompt_id and k not in taken), None)
            if k is None:
                unmatched[src].append(g)
            else:
                taken.add(k)
                by_own[k].append((src, g))
    return PeerPairing(by_own, unmatched)


def drop_all(peers: Mapping[str, Sequence[ScoredGroup]], reason: str) -> dict[str, dict[str, int]]:
    """Flows that drop every delivered peer response for ``reason``."""
    return {src: {reason: sum(len(g.rollouts) for g in gs)} for src, gs in peers.items()}


@register_regime("none")
class NoSharing(Regime):
    """Plain GRPO per policy: each policy trains on its own groups only (subscribes to nothing); it reports no
    statistics of its own (``TrainingPlan.metrics`` is ``None``)."""

    stats_type = None

    def plan(self, receiver, own, peers, num_mini_batches, scores=None):
        batch = own_batch(receiver, own)
        return TrainingPlan(batch, split_rows(len(batch), num_mini_batches),
                            flows=drop_all(peers, DropReason.NOT_SUBSCRIBED))
