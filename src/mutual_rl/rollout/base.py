"""The rollout engine interface: every engine (HF ``generate``, vLLM) returns the same :class:`Rollout` records."""

from __future__ import annotations

from collections.abc import Sequence

from mutual_rl.model.spec import SamplingSpec
from mutual_rl.types import Problem, Rollout


class RolloutEngine:
    """Base class of the rollout engines (configured as class_path HFRolloutEngine / VLLMRolloutEngine)."""

    def generate(
        self, policy, problems: Sequence[Problem], sampling: SamplingSpec, *, step: int, group_id_base: int = 0
    ) -> list[list[Rollout]]:
        """``sampling.n`` rollouts per problem, as one list per problem (same order as ``problems``).

        Each record carries the sampled ids, the log-prob of every sampled token under the *sampling*
        distribution (temperature and top-p applied), the finish reason and the character offsets of the
        response tokens in the decoded response text.
        """
        raise NotImplementedError

    def place(self, name: str, placement: str | int) -> None:
        """Serve policy ``name``'s rollouts per the MWRA placement (``"colocate"``: the trainer's device; an int:
        that device). An engine that cannot honour a placement raises a ``ValueError`` naming the fix."""
        raise NotImplementedError
