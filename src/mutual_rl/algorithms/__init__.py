"""Pure tensor functions of the GRPO / DAPO update (docs/methods.md §1), with one registry per family."""

from mutual_rl.algorithms.advantages import (
    ADVANTAGE_SCALES,
    group_outcome_stats,
    group_success_counts,
    grpo_advantages,
)
from mutual_rl.algorithms.aggregation import AGGREGATIONS, aggregate
from mutual_rl.algorithms.kl import KL_ESTIMATORS, kl_penalty
from mutual_rl.algorithms.losses import policy_loss, zero_advantage_skip_mask
from mutual_rl.algorithms.masking import masked_mean, masked_sum, token_entropy

__all__ = [
    "ADVANTAGE_SCALES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "aggregate",
    "group_outcome_stats",
    "group_success_counts",
    "grpo_advantages",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "policy_loss",
    "token_entropy",
    "zero_advantage_skip_mask",
]
