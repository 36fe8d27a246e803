"""Rollout engines: one interface (:class:`RolloutEngine`), resolved by name.

``hf`` (Hugging Face ``generate``; CPU and GPU reference) is always available; ``vllm`` is imported lazily, only
when selected, so the package works without vllm installed.
"""

from __future__ import annotations

from mutual_rl.rollout.base import RolloutEngine

ENGINES = ("hf", "vllm")


def get_engine(name: str, **kwargs) -> RolloutEngine:
    if name == "hf":
        from mutual_rl.rollout.hf import HFRolloutEngine

        return HFRolloutEngine(**kwargs)
    if name == "vllm":
        from mutual_rl.rollout.vllm import VLLMRolloutEngine  # lazy: vllm is an optional GPU extra

        return VLLMRolloutEngine(**kwargs)
    raise ValueError(f"Unknown rollout engine {name!r}; choose one of: {', '.join(ENGINES)}.")


__all__ = ["ENGINES", "RolloutEngine", "get_engine"]
