"""The learning side of a policy: scoring and GRPO advantages, the update loop, its objectives, the learning-rate
schedule and the FSDP lockstep helpers."""

from mutual_rl.update.config import GRPOConfig
from mutual_rl.update.loop import update_policy

__all__ = ["GRPOConfig", "update_policy"]
