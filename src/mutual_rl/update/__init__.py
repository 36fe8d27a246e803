"""The learning side of a policy: scoring and GRPO advantages, the update loop, its objectives, the learning-rate schedule and
the FSDP lockstep helpers."""
