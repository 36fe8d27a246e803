"""Rollout engines: one base class (:class:`RolloutEngine`), configured as ``class_path`` / ``init_args`` or by name.

``HFRolloutEngine`` (``hf``: Hugging Face ``generate``; CPU and GPU reference) always works; ``VLLMRolloutEngine``
(``vllm``) imports vllm only when one is built, so the package works without vllm installed; ``AutoRolloutEngine``
(``auto``, the default) chooses one of them per run (``rollout/auto.py``).
"""

from __future__ import annotations

from mutual_rl.interfaces import RolloutEngine
from mutual_rl.rollout.auto import AutoRolloutEngine
from mutual_rl.rollout.hf import HFRolloutEngine, NonFiniteLogitsError
from mutual_rl.rollout.vllm import VLLMRolloutEngine

ENGINES = {"auto": AutoRolloutEngine, "hf": HFRolloutEngine, "vllm": VLLMRolloutEngine}


def get_engine(name: str, **kwargs) -> RolloutEngine:
    """A new engine registered as ``name`` (``hf`` | ``vllm``) with its keyword arguments."""
    if name not in ENGINES:
        raise ValueError(f"Unknown rollout engine {name!r}; choose one of: {', '.join(ENGINES)}.")
    return ENGINES[name](**kwargs)


def as_engine(engine: RolloutEngine | str) -> RolloutEngine:
    """``engine`` itself, or a new engine registered under that name; a ``TypeError`` naming the setting otherwise."""
    engine = get_engine(engine) if isinstance(engine, str) else engine
    if not isinstance(engine, RolloutEngine):
        raise TypeError(f"model.rollout_engine must be a RolloutEngine (mutual_rl.interfaces: generate, place, "
                        f"sync_weights, close), e.g. class_path HFRolloutEngine or VLLMRolloutEngine, or the name "
                        f"auto, hf or vllm; got {type(engine).__name__}.")
    return engine


__all__ = ["ENGINES", "AutoRolloutEngine", "HFRolloutEngine", "NonFiniteLogitsError", "RolloutEngine", "VLLMRolloutEngine", "as_engine",
           "get_engine"]
