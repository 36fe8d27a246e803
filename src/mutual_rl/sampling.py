"""How a policy samples its rollouts (``model.policies[i].sampling``): a record of its own, below the interfaces that
take it (:class:`mutual_rl.interfaces.RolloutEngine`) and the policy's config (:mod:`mutual_rl.model.spec`, which
re-exports it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SamplingSpec:
    """How a policy samples its rollouts."""

    n: int = 8
    """Rollouts per prompt (group size G)."""
    temperature: float = 1.0
    """Sampling temperature; log-probs are those of the tempered distribution."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = 0
    """Top-k filter (0 = off; transformers would otherwise apply 50)."""
    max_new_tokens: int = 32
    """Longest response; longer ones finish with reason length."""

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"sampling.n must be >= 1 (got {self.n}).")
        if self.temperature <= 0:
            raise ValueError(f"sampling.temperature must be > 0 (got {self.temperature}); use a small value for near-greedy.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1] (got {self.top_p}).")
        if self.top_k < 0:
            raise ValueError(f"sampling.top_k must be >= 0 (got {self.top_k}); 0 turns it off.")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens must be >= 1 (got {self.max_new_tokens}).")
