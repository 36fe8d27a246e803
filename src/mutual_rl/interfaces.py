"""The two interfaces the training step calls: a receiver's sharing :class:`Regime` and the :class:`RolloutEngine`.

They live at the bottom of the package (beside the records of :mod:`mutual_rl.types`), so configuration specs can
name them as types and the step can call every method they declare without asking whether an implementation has it.
The built-in regimes are in :mod:`mutual_rl.regimes`, the engines in :mod:`mutual_rl.rollout`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from mutual_rl.sampling import SamplingSpec
from mutual_rl.stats import SyncStats
from mutual_rl.types import Problem, Rollout, ScoredGroup, Scores, ScoringRequest, TrainingPlan


class Regime:
    """Base class: ``plan`` builds a receiver's training plan for one step, from its own groups, the delivered peer
    groups and, when the regime asked for them in ``request``, the receiver's log-probs of crossed peer responses
    and numbers agreed over every process (:class:`~mutual_rl.types.Scores`). The step runs every such forward and
    collective (``mutual_rl.step.scoring``): a regime computes on what it is given and never runs a model or a
    collective itself. ``mutual_rl.step.scoring.plan_regime`` runs the two calls in one process.

    ``subscribes`` names the record kinds the regime reads from peers (``rollout``, ``reward``, ``advantage``;
    ``trace`` records are made on the receiver side by the THL, never subscribed to); ``()`` means it reads
    nothing. A regime may keep state across steps (e.g. HACPO's capability
    window): it then implements ``state_dict`` / ``load_state_dict`` so a resumed run continues exactly.
    """

    subscribes: tuple[str, ...] = ()
    #: the frozen record class of the statistics its plans carry (``TrainingPlan.metrics``); ``None``: none
    stats_type: ClassVar[type | None] = None
    #: a response with reward above this counts as a success; the module sets it from
    #: ``algorithm.success_threshold`` (its one source) on every receiver's regime
    success_threshold: float = 0.0
    #: THL alignment granularity of the peer traces this regime crosses (``word`` | ``span``): the one the step's
    #: THL residual report measures with; regimes that take a ``granularity`` argument set their own
    granularity: str = "word"

    def request(
        self, receiver, own: Sequence[ScoredGroup], peers: Mapping[str, Sequence[ScoredGroup]]
    ) -> ScoringRequest:
        """What must be computed before :meth:`plan` (default: nothing). ``peers`` are every delivered group: a
        regime that measures something on all of them (HACPO's capability) asks for it here, whatever it pools."""
        return ScoringRequest()

    def plan(
        self, receiver, own: Sequence[ScoredGroup], peers: Mapping[str, Sequence[ScoredGroup]], num_mini_batches: int,
        scores: Scores | None = None,
    ) -> TrainingPlan:
        """The training plan; ``scores`` answers :meth:`request` on the same groups (``None``: nothing asked)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


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
        that device). An engine that cannot honour a placement raises a ``ValueError`` naming the fix; this base
        accepts only ``"colocate"``."""
        if placement != "colocate":
            raise ValueError(f"policy {name!r}: MWRA placement {placement!r}, but rollout engine "
                             f"{type(self).__name__} serves rollouts only on the trainer's device; use placement: "
                             "colocate.")

    def sync_weights(self, policy) -> SyncStats | None:
        """After each update of ``policy``: an engine that holds its own copy of the weights (vLLM) pushes the new
        weights into it and returns what the sync took; an engine that samples with the training model itself
        (this base, HF ``generate``) has nothing to do and returns ``None``."""
        return None

    def close(self) -> None:
        """Release what the engine holds (when a run ends); nothing in this base."""
