"""Sharing regimes: one interface, one registry.

A receiver's regime is a pure transform from (its own scored groups, the peers' scored groups for the same
prompts) to that policy's training plan: the rows to train on and the order of its mini-batches. Regimes are not
callbacks (DESIGN); anything that crosses tokenizers goes through the THL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from mutual_rl.policies.batch import collate
from mutual_rl.types import PolicyBatch, ScoredGroup


@dataclass
class TrainingPlan:
    """What one receiver trains on this step."""

    batch: PolicyBatch
    mini_batches: list[list[int]]  # row indices of each mini-batch, in execution order
    metrics: dict[str, float]


class Regime:
    """Base class: ``plan`` builds a receiver's training plan for one step."""

    def plan(
        self, receiver, own: Sequence[ScoredGroup], peers: Mapping[str, Sequence[ScoredGroup]], num_mini_batches: int
    ) -> TrainingPlan:
        raise NotImplementedError


_REGIMES: dict[str, Callable[..., Regime]] = {}


def register_regime(name: str):
    def deco(cls):
        if name in _REGIMES:
            raise ValueError(f"regime {name!r} is already registered")
        _REGIMES[name] = cls
        return cls

    return deco


def get_regime(name: str, **kwargs) -> Regime:
    if name not in _REGIMES:
        raise ValueError(f"Unknown regime {name!r}; choose one of: {', '.join(sorted(_REGIMES))}.")
    return _REGIMES[name](**kwargs)


def available_regimes() -> list[str]:
    return sorted(_REGIMES)


def split_rows(num_rows: int, num_mini_batches: int) -> list[list[int]]:
    """Contiguous, near-equal mini-batches of ``range(num_rows)`` (groups stay together when sizes divide)."""
    k = max(1, min(num_mini_batches, num_rows))
    bounds = torch.linspace(0, num_rows, k + 1).round().long().tolist()
    return [list(range(bounds[i], bounds[i + 1])) for i in range(k) if bounds[i + 1] > bounds[i]]


def own_batch(receiver, own: Sequence[ScoredGroup]) -> PolicyBatch:
    rollouts = [r for g in own for r in g.rollouts]
    adv = torch.cat([g.advantages for g in own])
    return collate(rollouts, adv, receiver.tokenizer.pad_token_id)


@register_regime("none")
class NoSharing(Regime):
    """Plain GRPO per policy: each policy trains on its own groups only."""

    def plan(self, receiver, own, peers, num_mini_batches):
        batch = own_batch(receiver, own)
        return TrainingPlan(batch, split_rows(len(batch), num_mini_batches), {})
