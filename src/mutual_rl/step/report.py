"""The typed report of one training step: per policy, what it sampled, how it scored, what it trained on, what
crossed into it and what its engine synced; plus the exchange's flow counts.

:func:`mutual_rl.step.pipeline.run_step` returns a :class:`StepReport`; the module logs :meth:`StepReport.metrics`
(``<policy>/<name>`` for a policy's statistics, ``thl/...`` and ``exchange/...`` as they are), MWRA's accounting reads
:meth:`PolicyStepReport.usage`, and the collapse warning reads the fields. Under several processes
:func:`reduce_over_ranks` makes every rank's report the same: counts summed, everything else the mean over ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from mutual_rl.distributed import gather_objects
from mutual_rl.stats import (
    COUNT,
    DynamicSamplingStats,
    RolloutStats,
    ScoringStats,
    SyncStats,
    UpdateStats,
    Usage,
    count_names,
    flatten,
    merge,
    prefixed,
)
from mutual_rl.types import ScoredGroup


@dataclass(frozen=True)
class PolicyStepReport:
    """One policy's step."""

    name: str = field(metadata={"log": False, "merge": False})
    rollout: RolloutStats = field(metadata=prefixed(""))
    scoring: ScoringStats = field(metadata=prefixed(""))
    dynamic_sampling: DynamicSamplingStats | None = field(default=None, metadata=prefixed("dynamic_sampling/"))
    update: UpdateStats | None = field(default=None, metadata=prefixed(""))
    """``None``: the policy did not update this step (MWRA's ``update_every``)."""
    regime: Any = field(default=None, metadata=prefixed(""))
    """The receiver's regime's own statistics (``TrainingPlan.metrics``: a record of the regime's
    ``stats_type``, logged by its field names; ``None``: the regime reports none)."""
    sync: SyncStats | None = field(default=None, metadata=prefixed(""))
    """The engine's weight sync after the update (engines that hold their own weights only)."""
    thl: Mapping[str, float] = field(default_factory=dict, metadata={"log": False})
    """THL residuals of the peer responses crossed into this receiver (``thl/<source>-><receiver>/...``)."""
    histograms: Mapping[str, torch.Tensor] = field(default_factory=dict, metadata={"log": False, "merge": False})
    """The regime's per-step value distributions (``TrainingPlan.histograms``), logged as TensorBoard histograms."""
    groups: tuple[ScoredGroup, ...] = field(default=(), metadata={"log": False, "merge": False})
    """The groups it trained on (this process's; the sample log shows some)."""

    def metrics(self) -> dict[str, float]:
        """``<policy>/<name>`` of every statistic present, and the THL residuals under their own names."""
        return {**flatten(self, f"{self.name}/"), **{k: float(v) for k, v in self.thl.items()}}

    def usage(self) -> Usage:
        u = self.update
        return Usage(generated_tokens=self.rollout.generated_tokens, gen_s=self.rollout.gen_s,
                     trained_tokens=u.trained_tokens if u is not None else 0.0,
                     train_s=(u.train_s or 0.0) if u is not None else 0.0, updated=u is not None)


@dataclass(frozen=True)
class StepReport:
    """A training step of every policy (module docstring)."""

    step: int = field(metadata={"log": False, "merge": False})
    policies: Mapping[str, PolicyStepReport] = field(metadata={"log": False})
    exchange: Mapping[str, float] = field(default_factory=dict, metadata={**COUNT, **prefixed("")})
    """The exchange's flow counts of this step (``exchange/<source>-><receiver>/...``)."""
    replayed_rewards: Mapping[str, float] = field(default_factory=dict, metadata={"log": False})
    """Stored-peer mode: the mean reward of each replayed policy's recorded groups for this step's prompts."""

    def metrics(self) -> dict[str, float]:
        out = flatten(self)
        for report in self.policies.values():
            out.update(report.metrics())
        out.update({f"{name}/reward": r for name, r in self.replayed_rewards.items()})
        return out

    def count_names(self) -> set[str]:
        """The logged names that are counts of this step (0, not NaN, on a later step that lacks them)."""
        names = count_names(self)
        for report in self.policies.values():
            names |= count_names(report, f"{report.name}/")
        return names

    @property
    def reward(self) -> float:
        """The mean reward over the trained policies (the progress bar's ``reward``)."""
        return sum(r.scoring.reward for r in self.policies.values()) / max(len(self.policies), 1)

    @property
    def histograms(self) -> dict[str, torch.Tensor]:
        return {f"{name}/{k}": v for name, r in self.policies.items() for k, v in r.histograms.items()}


def reduce_over_ranks(report: StepReport) -> StepReport:
    """Every rank's report merged (:func:`mutual_rl.stats.merge`: counts summed, the rest averaged over the ranks
    that have it), the same on every rank; this rank's histograms are kept. Identity in one process."""
    light = StepReport(report.step, {k: replace(r, histograms={}, groups=()) for k, r in report.policies.items()},
                       report.exchange, report.replayed_rewards)
    gathered = gather_objects(light)
    if len(gathered) == 1:
        return report
    merged = merge(gathered)
    policies = {k: replace(merged.policies[k], histograms=r.histograms, groups=r.groups)
                for k, r in report.policies.items()}
    return StepReport(merged.step, policies, merged.exchange, merged.replayed_rewards)
