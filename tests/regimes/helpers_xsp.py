"""Shared checks for the XGRPO / SGT / PRP regime tests."""

from __future__ import annotations

import torch

from mutual_rl.types import ScoredGroup, TrainingPlan


def delivered(peers: dict[str, list[ScoredGroup]]) -> dict[str, int]:
    return {src: sum(len(g.rollouts) for g in gs) for src, gs in peers.items()}


def assert_flows(plan: TrainingPlan, peers: dict[str, list[ScoredGroup]], expected: dict | None = None) -> None:
    """Every source is accounted for and its flows sum to the responses delivered; optionally exact flows."""
    assert set(plan.flows) == set(peers)
    for src, n in delivered(peers).items():
        assert sum(plan.flows[src].values()) == n, (src, plan.flows[src], n)
        assert all(v > 0 for v in plan.flows[src].values()), plan.flows[src]
    if expected is not None:
        assert plan.flows == expected


def assert_partition(plan: TrainingPlan) -> None:
    """The mini-batches cover every row exactly once."""
    rows = sorted(r for mb in plan.mini_batches for r in mb)
    assert rows == list(range(len(plan.batch)))


def pooled_std(values: list[float]) -> float:
    return float(torch.tensor(values, dtype=torch.float64).std())
