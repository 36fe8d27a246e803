"""GRPO/DAPO settings shared by every policy of a run (``model.algorithm``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from mutual_rl.update.objectives import DAPO


@dataclass
class GRPOConfig:
    """GRPO/DAPO settings shared by all policies (docs/methods.md §1; defaults from GRAFT Table 3 and DAPO)."""

    clip_low: float = 0.2
    """Lower clip ε_low of the token ratio."""
    clip_high: float = 0.28
    """Upper clip ε_high (DAPO clip-higher)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages (off by default)."""
    agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    """Loss aggregation: token-mean | seq-mean-token-mean | seq-mean-token-sum-norm."""
    scale: Literal["group", "none"] = "group"
    """Advantage scale: group (divide by the group std) | none (Dr.GRPO)."""
    eps: float = 1e-6
    kl_coef: float = 0.0
    """β of the KL penalty to the reference (0 = off; with LoRA the reference is the adapter-free base)."""
    kl_kind: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator: k1 | k2 | k3."""
    ppo_epochs: int = 1
    num_mini_batches: int = 4
    """Optimizer steps per policy per epoch (mini-batch = 1/4 of the step's responses by default)."""
    micro_batch_size: int = 0
    """Rows per forward/backward (0 = a whole mini-batch at once); changes no gradient."""
    max_tokens_per_micro_batch: int | Literal["auto"] = "auto"
    """Token budget (rows x padded length) of one forward/backward of the old-log-prob recompute, the update and the
    KL reference: rows are packed into micro-batches within it (update/packing.py); changes no value or gradient.
    auto: the memory plan's per-policy budget on CUDA (mutual_rl/memory/plan.py), 16384 elsewhere."""
    old_logp: Literal["recompute", "rollout"] = "recompute"
    """Behaviour log-probs: recompute (trainer forward before the update) | rollout (the sampler's trace)."""
    rollout_correction: Literal["none", "tis", "mis"] = "none"
    """Weigh the engine's samples back to the trainer's distribution, token by token, with w = π_trainer/π_engine
    (algorithms/rollout_correction.py): none | tis (the behaviour term times min(w, cap)) | mis (tokens with
    w > cap masked out). Needs old_logp: recompute; the mismatch (mean/max |Δ log p|, KL(engine‖trainer), weight
    mean/max, share over the cap) is logged per policy and step in every mode when old log-probs are recomputed."""
    rollout_correction_cap: float = 2.0
    """The cap C of rollout_correction (>= 1)."""
    success_threshold: float = 0.0
    """A response with reward above this counts as a success."""
    skip_zero_advantage: bool = True
    """Skip forward/backward of zero-advantage rows (no gradient change; see module docstring)."""
    on_nonfinite: Literal["raise", "skip"] = "raise"
    """A non-finite advantage, loss or gradient: raise (stop with an error naming the policy and the quantity) |
    skip (refuse that optimizer step, leave the weights and AdamW state as they were, count it in nonfinite_skipped)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop each policy's groups whose rewards are all equal (all-pass, all-fail) and sample
    extra training prompts until it holds data.batch_size mixed groups; only with model.regime: none
    (docs/methods.md section 1)."""
    dynamic_sampling_max_rounds: int = 9
    """Dynamic sampling: at most this many extra rounds of data.batch_size prompts per policy and step, then train
    on the mixed groups found (logged as limit_hit); 0 = filter only."""

    def dapo(self) -> DAPO:
        """The base objective (``update.objectives``): DAPO with these clip bounds, dual clip, aggregation and KL;
        the update completes a regime's objective with it (``objectives.resolve``)."""
        return DAPO(clip_low=self.clip_low, clip_high=self.clip_high, dual_clip=self.dual_clip, agg=self.agg,
                    kl_coef=self.kl_coef, kl_kind=self.kl_kind)

    def __post_init__(self):
        from mutual_rl.algorithms import ADVANTAGE_SCALES, AGGREGATIONS, KL_ESTIMATORS

        for name, value, choices in (
            ("agg", self.agg, AGGREGATIONS), ("scale", self.scale, ADVANTAGE_SCALES),
            ("kl_kind", self.kl_kind, KL_ESTIMATORS), ("old_logp", self.old_logp, ("recompute", "rollout")),
            ("on_nonfinite", self.on_nonfinite, NONFINITE_ACTIONS),
        ):
            if value not in choices:
                raise ValueError(f"algorithm.{name}={value!r} is not one of: {', '.join(choices)}.")
        if self.ppo_epochs < 1 or self.num_mini_batches < 1 or self.micro_batch_size < 0:
            raise ValueError("algorithm.ppo_epochs and num_mini_batches must be >= 1, micro_batch_size >= 0.")
        _check_numbers(self)
        from mutual_rl.algorithms.rollout_correction import check_mode

        check_mode(self.rollout_correction, self.rollout_correction_cap)
        if self.rollout_correction != "none" and self.old_logp != "recompute":
            raise ValueError(f"algorithm.rollout_correction={self.rollout_correction} weighs tokens by the trainer's "
                             "recomputed old log-probs over the engine's; with old_logp: rollout there are none. Set "
                             "old_logp: recompute, or rollout_correction: none.")
        budget = self.max_tokens_per_micro_batch
        if budget != "auto" and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ValueError(f"algorithm.max_tokens_per_micro_batch must be a number of tokens >= 1 or auto (the "
                             f"memory plan's on CUDA), got {budget!r}.")
        if self.dynamic_sampling_max_rounds < 0:
            raise ValueError(f"algorithm.dynamic_sampling_max_rounds must be >= 0 (0 = filter only, no extra rounds), "
                             f"got {self.dynamic_sampling_max_rounds}.")


NONFINITE_ACTIONS = ("raise", "skip")


def _check_numbers(cfg: GRPOConfig) -> None:
    """Signs and ranges of the algorithm's numbers, each error naming the field (a negative eps flips advantages, a
    negative kl_coef rewards moving away from the reference)."""
    finite = all(math.isfinite(v) for v in (cfg.clip_low, cfg.clip_high, cfg.eps, cfg.kl_coef, cfg.success_threshold))
    if not finite:
        raise ValueError("algorithm.clip_low, clip_high, eps, kl_coef and success_threshold must be finite numbers.")
    if not 0.0 <= cfg.clip_low < 1.0:
        raise ValueError(f"algorithm.clip_low must be in [0, 1) (got {cfg.clip_low}): the ratio's lower clip 1 - "
                         "clip_low; the default is 0.2.")
    if cfg.clip_high < 0.0:
        raise ValueError(f"algorithm.clip_high must be >= 0 (got {cfg.clip_high}): the ratio's upper clip 1 + "
                         "clip_high; the default is 0.28.")
    if cfg.dual_clip is not None and not (math.isfinite(cfg.dual_clip) and cfg.dual_clip > 1.0):
        raise ValueError(f"algorithm.dual_clip must be > 1 or null (got {cfg.dual_clip}); 3 is usual.")
    if cfg.eps <= 0.0:
        raise ValueError(f"algorithm.eps must be > 0 (got {cfg.eps}): it is added to the group's reward std before "
                         "dividing; the default is 1e-6.")
    if cfg.kl_coef < 0.0:
        raise ValueError(f"algorithm.kl_coef must be >= 0 (got {cfg.kl_coef}): the KL penalty's weight; 0 turns it "
                         "off.")
