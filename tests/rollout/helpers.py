"""Shared by the HF engine's equivalence tests: one seeded rollout call, and the comparison of two."""

from __future__ import annotations

import torch

from mutual_rl.rollout.hf import HFRolloutEngine
from tests.model.test_shared_prompts import PROBLEMS


def sampled(policy, sampling, seed: int, problems=PROBLEMS, **engine_attrs):
    """Every rollout of one ``HFRolloutEngine.generate`` call after ``torch.manual_seed(seed)``, flat; the engine's
    attributes set from ``engine_attrs`` (e.g. ``decode_attention=False``)."""
    engine = HFRolloutEngine()
    for name, value in engine_attrs.items():
        assert hasattr(engine, name), name
        setattr(engine, name, value)
    torch.manual_seed(seed)
    return [r for g in engine.generate(policy, problems, sampling, step=0) for r in g]


def assert_same_rollouts(reference, other, atol: float) -> None:
    """The same sampled tokens row by row, log-probs within ``atol`` (absolute)."""
    assert len(reference) == len(other)
    for a, b in zip(reference, other):
        assert torch.equal(a.response_ids, b.response_ids)
        torch.testing.assert_close(b.logp, a.logp, rtol=0, atol=atol)
