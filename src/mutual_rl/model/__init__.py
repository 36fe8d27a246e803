"""The model side of a policy: its config (spec), loading, the run-time wrapper (forward, LoRA, reference) and export."""

from mutual_rl.model.policy import Policy, build_policy
from mutual_rl.model.spec import LoraSpec, OptimizerSpec, PolicySpec, SamplingSpec, WarmStart

__all__ = ["LoraSpec", "OptimizerSpec", "Policy", "PolicySpec", "SamplingSpec", "WarmStart", "build_policy"]
