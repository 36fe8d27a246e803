"""One training step of N policies, as plain functions (no Lightning): rollouts, scoring, dynamic sampling, exchange,
plans, updates, weight sync, and the typed report it returns (:mod:`mutual_rl.step.pipeline`,
:mod:`mutual_rl.step.report`), set up by the one builder of ``mutual-rl fit`` and the Python API
(:mod:`mutual_rl.step.build`)."""

from mutual_rl.step.pipeline import StepContext, run_step, sample_policy, train_policy
from mutual_rl.step.report import PolicyStepReport, StepReport, reduce_over_ranks

__all__ = ["PolicyStepReport", "StepContext", "StepReport", "reduce_over_ranks", "run_step", "sample_policy",
           "train_policy"]
