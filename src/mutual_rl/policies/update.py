"""One policy's GRPO/DAPO update over a training plan: PPO epochs x mini-batches x micro-batches.

Per mini-batch: one optimizer step. Loss normalisers are those of the whole mini-batch (``token_count``,
``num_seqs``), so splitting a mini-batch into micro-batches changes no gradient, and micro-batch losses are
summed, never divided again by the number of accumulation steps (METHODS §1).

Efficiency that changes no gradient (METHODS §1): with no KL term, rows whose advantage is 0 (all-fail and
all-pass groups) contribute nothing to the gradient, so their forward/backward is skipped while their tokens still
count in the token-mean denominator. A mini-batch with no active row still takes its optimizer step with zero
gradients (AdamW's moments and weight decay move exactly as without the skip). A regime's NLL term (SGT) acts on
its own rows (``TrainingPlan.nll``), never on the skipped ones, so the skip stays exact with it.

Objectives come from the ``policies.objectives`` registry (``dapo`` by default; regimes may register their own,
e.g. HACPO's sequence-level objective); the NLL term of mini-batch ``i`` is added before its optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mutual_rl.algorithms import masked_mean, zero_advantage_skip_mask
from mutual_rl.policies.objectives import get_objective
from mutual_rl.regimes.base import NLLTerm, TrainingPlan
from mutual_rl.strategies import clip_grad_norm_
from mutual_rl.types import PolicyBatch


@dataclass
class GRPOConfig:
    """GRPO/DAPO settings shared by all policies (METHODS §1; defaults from GRAFT Table 3 and DAPO)."""

    clip_low: float = 0.2
    """Lower clip ε_low of the token ratio."""
    clip_high: float = 0.28
    """Upper clip ε_high (DAPO clip-higher)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages (off by default)."""
    agg: str = "token-mean"
    """Loss aggregation: token-mean | seq-mean-token-mean | seq-mean-token-sum-norm."""
    scale: str = "group"
    """Advantage scale: group (divide by the group std) | none (Dr.GRPO)."""
    eps: float = 1e-6
    kl_coef: float = 0.0
    """β of the KL penalty to the reference (0 = off; with LoRA the reference is the adapter-free base)."""
    kl_kind: str = "k3"
    """KL estimator: k1 | k2 | k3."""
    ppo_epochs: int = 1
    num_mini_batches: int = 4
    """Optimizer steps per policy per epoch (mini-batch = 1/4 of the step's responses by default)."""
    micro_batch_size: int = 0
    """Rows per forward/backward (0 = a whole mini-batch at once); changes no gradient."""
    old_logp: str = "recompute"
    """Behaviour log-probs: recompute (trainer forward before the update) | rollout (the sampler's trace)."""
    success_threshold: float = 0.0
    """A response with reward above this counts as a success."""
    skip_zero_advantage: bool = True
    """Skip forward/backward of zero-advantage rows (no gradient change; see module docstring)."""

    def __post_init__(self):
        from mutual_rl.algorithms import ADVANTAGE_SCALES, AGGREGATIONS, KL_ESTIMATORS

        for name, value, choices in (
            ("agg", self.agg, AGGREGATIONS), ("scale", self.scale, ADVANTAGE_SCALES),
            ("kl_kind", self.kl_kind, KL_ESTIMATORS), ("old_logp", self.old_logp, ("recompute", "rollout")),
        ):
            if value not in choices:
                raise ValueError(f"algorithm.{name}={value!r} is not one of: {', '.join(choices)}.")
        if self.ppo_epochs < 1 or self.num_mini_batches < 1 or self.micro_batch_size < 0:
            raise ValueError("algorithm.ppo_epochs and num_mini_batches must be >= 1, micro_batch_size >= 0.")


def chunks(rows: list[int], size: int) -> list[list[int]]:
    if size <= 0 or size >= len(rows):
        return [rows] if rows else []
    return [rows[i : i + size] for i in range(0, len(rows), size)]


@torch.no_grad()
def recompute_old_logp(policy, batch: PolicyBatch, rows: list[int], temperature: float, micro: int) -> None:
    """Overwrite ``batch.old_logp`` of ``rows`` with the current policy's log-probs (before the update)."""
    for part in chunks(rows, micro):
        sub = batch.select(part)
        logp, _ = policy.response_logp(sub.input_ids, sub.attention_mask, batch.response_width, temperature)
        batch.old_logp[part] = logp.float() * sub.response_mask


def nll_loss(policy, nll: NLLTerm, rows: list[int], temperature: float) -> tuple[torch.Tensor, float]:
    """``coef · mean_rows[token-mean NLL]`` of ``rows`` of the NLL batch, and the unscaled mean NLL."""
    sub = nll.batch.select(rows)
    logp, _ = policy.response_logp(sub.input_ids, sub.attention_mask, nll.batch.response_width, temperature)
    per_seq = -(logp * sub.response_mask).sum(-1) / sub.response_mask.sum(-1).clamp(min=1)
    mean = per_seq.mean()
    return nll.coef * mean, float(mean.detach())


def update_policy(
    policy, plan: TrainingPlan, cfg: GRPOConfig,
    backward: Callable[[torch.Tensor], None], step_optimizer: Callable[[], None], zero_grad: Callable[[], None],
) -> dict[str, float]:
    """Run the update of ``plan``; returns metrics (token-weighted means of per-token ones).

    ``backward``, ``step_optimizer`` and ``zero_grad`` come from the trainer (Lightning's manual optimization).
    Old log-probs are recomputed for the receiver's own rows when ``cfg.old_logp == "recompute"`` and, always,
    for rows the regime marks ``needs_old_logp`` (peer responses evaluated under the receiver's own old policy).
    Other peer rows keep the old log-probs their regime set (a THL-aligned peer trace, or the receiver's
    log-probs the regime already computed): recomputing them would discard the trace or repeat the work.
    """
    batch, objective = plan.batch, get_objective(plan.objective)
    temperature = policy.spec.sampling.temperature
    params = [p for p in policy.parameters() if p.requires_grad]
    skip = zero_advantage_skip_mask(batch.advantages, cfg.kl_coef) if cfg.skip_zero_advantage \
        else torch.zeros(len(batch), dtype=torch.bool)
    need = batch.needs_old_logp | ((cfg.old_logp == "recompute") & ~batch.is_peer)
    recompute_old_logp(policy, batch, [i for i in range(len(batch)) if need[i] and not skip[i]], temperature,
                       cfg.micro_batch_size)
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    steps_metrics = {"grad_norm": 0.0, "loss": 0.0, "nll": 0.0}
    tokens_seen, n_steps = 0.0, 0

    def add(key: str, value: float, weight: float) -> None:
        sums[key] = sums.get(key, 0.0) + value * weight
        weights[key] = weights.get(key, 0.0) + weight

    for _ in range(cfg.ppo_epochs):
        for i, rows in enumerate(plan.mini_batches):
            mb = batch.select(rows)
            token_count = mb.response_mask.sum()
            num_seqs = int((mb.response_mask.sum(-1) > 0).sum())
            active = [j for j, r in enumerate(rows) if not skip[r]]
            zero_grad()
            for part in chunks(active, cfg.micro_batch_size):
                sub = mb.select(part)
                logp, entropy = policy.response_logp(
                    sub.input_ids, sub.attention_mask, mb.response_width, temperature, with_entropy=True
                )
                ref = None
                if cfg.kl_coef:
                    with torch.no_grad():
                        ref, _ = policy.response_logp(sub.input_ids, sub.attention_mask, mb.response_width,
                                                      temperature, reference=True)
                loss, m = objective(logp, sub, cfg=cfg, token_count=token_count, num_seqs=num_seqs,
                                    max_len=mb.response_width, ref_logp=ref, **plan.objective_kwargs)
                backward(loss)
                n_tok = float(sub.response_mask.sum())
                tokens_seen += n_tok
                for k, v in m.items():
                    if k.endswith("num_tokens") or k in ("pg_loss", "kl_loss"):
                        continue
                    w = float(m[k.rsplit("/", 1)[0] + "/num_tokens"]) if "/" in k else n_tok
                    add(k, float(v), w)
                add("entropy", float(masked_mean(entropy, sub.response_mask)), n_tok)
                steps_metrics["loss"] += float(loss.detach())
            if plan.nll is not None and plan.nll.mini_batches[i]:
                extra, mean_nll = nll_loss(policy, plan.nll, plan.nll.mini_batches[i], temperature)
                backward(extra)
                steps_metrics["nll"] += mean_nll
                steps_metrics["loss"] += float(extra.detach())
            for p in params:  # a skipped mini-batch still steps, with zero gradients
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            norm = clip_grad_norm_(params, policy.spec.optimizer.grad_clip or float("inf"))  # FSDP-aware
            steps_metrics["grad_norm"] += float(norm)
            step_optimizer()
            policy.version += 1
            n_steps += 1
    out = {k: sums[k] / weights[k] for k in sums if weights[k] > 0}
    out.update({k: v / max(n_steps, 1) for k, v in steps_metrics.items()})
    if plan.nll is None:
        out.pop("nll")
    out["trained_tokens"] = tokens_seen
    out["skipped_frac"] = float(skip.float().mean()) if len(batch) else 0.0
    return out
