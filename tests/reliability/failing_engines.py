"""A real rollout engine with a real fault, for ``tests/reliability/test_rollout_faults.py``: the HF engine, whose
``generate`` or ``sync_weights`` raises once, for one policy at one step (named by ``class_path`` in a config)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from mutual_rl.rollout import HFRolloutEngine


class FailingEngine(HFRolloutEngine):
    """:class:`HFRolloutEngine` whose ``phase`` raises ``RuntimeError`` for ``policy`` at ``step``, once: the first
    time it does, it creates ``marker``; while ``marker`` exists it never raises (a transient fault: the resumed run
    goes through)."""

    def __init__(self, phase: Literal["generate", "sync_weights"] = "generate", step: int = 1, policy: str = "",
                 marker: str = "fault-raised"):
        super().__init__()
        self.phase, self.step, self.policy, self.marker = phase, step, policy, Path(marker)
        self.current_step = -1

    def _maybe_fail(self, phase: str, policy) -> None:
        if phase == self.phase and self.current_step == self.step and policy.name == self.policy \
                and not self.marker.exists():
            self.marker.touch()
            raise RuntimeError(f"CUDA error: an illegal memory access was encountered (injected in {phase})")

    def generate(self, policy, problems, sampling, *, step: int, group_id_base: int = 0):
        self.current_step = step
        self._maybe_fail("generate", policy)
        return super().generate(policy, problems, sampling, step=step, group_id_base=group_id_base)

    def sync_weights(self, policy):
        self._maybe_fail("sync_weights", policy)
        return super().sync_weights(policy)


def even_length(completion: str, answer: str) -> float:
    """A reward with signal from the first step (1 iff the response has an even length), so that every step trains."""
    return float(len(completion) % 2 == 0)
