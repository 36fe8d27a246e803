"""Held-out evaluation during fit and in ``mutual-rl validate``.

Each policy samples ``k`` responses per problem (papers' protocol: temperature 0.6, top-p 0.95, k = 8); pass@1 is
the mean over the k samples, then over problems; reported overall and per skill, with unbiased pass@k. Sampling
runs under its own seed and the training RNG state is restored afterwards, so evaluating changes nothing in
training (a resumed run and an uninterrupted one draw the same rollouts).
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

import torch

from mutual_rl.evaluation.metrics import mean_pass_at_k
from mutual_rl.policies.spec import SamplingSpec


@dataclass
class EvalConfig:
    """Held-out evaluation protocol."""

    k: int = 8
    """Samples per problem."""
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int | None = None
    """Default: each policy's own ``sampling.max_new_tokens``."""
    seed: int = 1234
    """Seed of evaluation sampling (independent of training)."""

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"evaluation.k must be >= 1 (got {self.k}).")


class Evaluator:
    def __init__(self, cfg: EvalConfig, reward_fn, engine):
        self.cfg, self.reward_fn, self.engine = cfg, reward_fn, engine
        self._counts: dict[str, dict[str, list[tuple[int, int]]]] = {}
        self._saved = None

    def start(self, seed: int) -> None:
        self._saved = (torch.get_rng_state(), random.getstate())
        torch.manual_seed(seed)
        random.seed(seed)
        self._counts = defaultdict(lambda: defaultdict(list))

    def add(self, policy, problems) -> None:
        s = policy.spec.sampling
        sampling = SamplingSpec(n=self.cfg.k, temperature=self.cfg.temperature, top_p=self.cfg.top_p, top_k=0,
                                max_new_tokens=self.cfg.max_new_tokens or s.max_new_tokens)
        groups = self.engine.generate(policy, problems, sampling, step=-1)
        for problem, rollouts in zip(problems, groups):
            c = sum(self.reward_fn(r.response_text, problem.answer) > 0 for r in rollouts)
            self._counts[policy.name][problem.skill].append((len(rollouts), int(c)))

    def finish(self) -> dict[str, dict[str, float]]:
        if self._saved is not None:
            torch.set_rng_state(self._saved[0])
            random.setstate(self._saved[1])
            self._saved = None
        out: dict[str, dict[str, float]] = {}
        for name, by_skill in self._counts.items():
            everything = [x for xs in by_skill.values() for x in xs]
            m = {"pass@1": mean_pass_at_k(everything, 1), f"pass@{self.cfg.k}": mean_pass_at_k(everything, self.cfg.k),
                 "num_problems": float(len(everything))}
            if len(by_skill) > 1 or "" not in by_skill:
                for skill, xs in by_skill.items():
                    m[f"pass@1/{skill or 'other'}"] = mean_pass_at_k(xs, 1)
            out[name] = m
        return out
