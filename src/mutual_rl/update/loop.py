"""One policy's GRPO/DAPO update over a training plan: PPO epochs x mini-batches x micro-batches.

Per mini-batch: one optimizer step. Loss normalisers are those of the whole mini-batch (``token_count``,
``num_seqs``), so splitting a mini-batch into micro-batches changes no gradient, and micro-batch losses are
summed, never divided again by the number of accumulation steps (docs/methods.md §1).

Micro-batches are packed to a token budget (``algorithm.max_tokens_per_micro_batch``, auto by default: the memory
plan's on CUDA, ``update/packing.py``'s default elsewhere), and ``micro_batch_size`` rows when that is set: the
old-log-prob recompute, the update's forward/backward with its KL reference, and the NLL term all run in such
micro-batches, each on its own width (columns that are padding in all its rows cut away). Same log-probs and
gradients as one forward over all rows up to float rounding (within 1e-6 + 1e-6·|value| in float32,
tests/update/test_packing.py).

Efficiency that changes no gradient (docs/methods.md §1, "Skipping zero-advantage rows"): with no KL term, rows
whose advantage is 0 (all-fail and all-pass groups) contribute nothing to the gradient, so their forward/backward
is skipped while their tokens still count in the token-mean denominator. A mini-batch with no active row still
takes its optimizer step with zero gradients (AdamW's moments and weight decay move exactly as without the skip).
A regime's NLL term (SGT) acts on its own rows (``TrainingPlan.nll``), never on the skipped ones, so the skip
stays exact with it.

Rollout correction (``algorithm.rollout_correction``, ``algorithms/rollout_correction.py``): where the recompute
replaces an engine's trace, the mismatch is measured (``UpdateStats.rollout``) and, under ``tis`` / ``mis``, each
token's behaviour term is weighted by ``min(π_trainer/π_engine, cap)`` or masked past the cap.

The objective is the plan's (``TrainingPlan.objective``, completed with the algorithm's scalars) or, when it names
none, DAPO with those scalars (``GRPOConfig.dapo()``; ``update/objectives.py``); the NLL term of mini-batch ``i`` is
added before its optimizer step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from mutual_rl.algorithms import masked_mean, policy_loss, zero_advantage_skip_mask
from mutual_rl.algorithms.rollout_correction import behaviour_weighted, correction_weights
from mutual_rl.distributed import agree_max, agree_sum, in_lockstep, padded, rank_and_world
from mutual_rl.stats import UpdateStats
from mutual_rl.strategies import clip_grad_norm_
from mutual_rl.types import NLLTerm, PolicyBatch, TrainingPlan
from mutual_rl.update.accumulate import _MiniBatchResult
from mutual_rl.update.config import GRPOConfig
from mutual_rl.update.objectives import Norms, Objective, resolve
from mutual_rl.update.packing import lengths, narrow, pack, part_size, token_budget, widen

_UNBOUNDED = 1 << 62  # no token bound (a budget of 0)


class NonFiniteUpdateError(FloatingPointError):
    """A policy's update met a non-finite advantage, loss, gradient or weight; no weight was changed by it."""


def _nonfinite_message(policy, quantity: str, where: str, cause: str, refused: str) -> str:
    lr = policy.spec.optimizer.lr
    return (f"policy {policy.name!r}: non-finite {quantity} {where}; {refused}. Likely cause: {cause}. Current "
            f"optimizer.lr = {lr:g}. Set algorithm.on_nonfinite: skip to skip such updates (counted as "
            f"<policy>/nonfinite_skipped) instead of stopping.")


_CAUSE_REWARD = "the reward function returned NaN/inf, or rewards so large that their spread overflows"
_CAUSE_LR = ("the learning rate is too high for this model (weights or logits overflowed), or an earlier "
             "update already diverged")


@torch.no_grad()
def recompute_old_logp(policy, batch: PolicyBatch, rows: list[int], temperature: float, micro: int,
                       budget: int | None = None) -> None:
    """Overwrite ``batch.old_logp`` of ``rows`` with the current policy's log-probs (before the update); ``batch``
    on the policy's device. Forwards of at most ``budget`` token positions and ``micro`` rows (``update/packing.py``;
    ``None`` / 0: no bound), each on its own width."""
    prompt, response = lengths(batch)
    packed = pack(rows, prompt, response, budget or _UNBOUNDED, micro) if rows else []
    parts = padded(policy, packed)  # under FSDP: every rank runs the busiest rank's count of forwards
    for part in parts:
        if part is None:  # lockstep dummy
            policy.dummy_logp(temperature)
            continue
        sub = narrow(batch.select(part), part_size(part, prompt, response))
        logp, _ = policy.response_logp(sub.input_ids, sub.attention_mask, sub.response_width, temperature)
        batch.old_logp[part] = widen(logp.float() * sub.response_mask, batch.response_width)


def nll_loss(policy, nll: NLLTerm, rows: list[int], temperature: float,
             num_rows: float | None = None, size: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``coef · sum_rows[token-mean NLL] / num_rows`` of ``rows`` of the NLL batch (on the policy's device;
    ``num_rows``: the mini-batch's NLL row count, global under FSDP lockstep, so the term is ``coef ·`` the mean
    NLL of the mini-batch's rows; ``None``: ``len(rows)``), and the unscaled local mean NLL (a 0-d tensor, read
    with the update's other values). ``size``: the rows' longest prompt and response (``packing.part_size``)."""
    sub = narrow(nll.batch.select(rows), size)
    logp, _ = policy.response_logp(sub.input_ids, sub.attention_mask, sub.response_width, temperature)
    per_seq = -(logp * sub.response_mask).sum(-1) / sub.response_mask.sum(-1).clamp(min=1)
    total = per_seq.sum() / (num_rows if num_rows is not None else len(rows))
    return nll.coef * total, per_seq.detach().mean()


@dataclass
class _MiniBatch:
    """One mini-batch's work and normalisers (global ones under FSDP lockstep)."""

    rows: list[int]
    parts: list[list[int]]  # active (non-skipped) positions in the mini-batch, per forward/backward
    part_sizes: list[tuple[int, int]]  # per part: its longest prompt and response (packing.narrow without a read)
    nll_rows: list[int]
    token_count: torch.Tensor | float
    num_seqs: float
    max_len: int
    nll_num_rows: float | None = None  # the NLL term's rows in this mini-batch (global under lockstep)
    scale: float = 1.0  # loss multiplier: the world size under lockstep (FSDP averages gradients over ranks)
    num_parts: int = 0  # forwards to run (>= len(parts) under lockstep; the rest are dummies)
    nll_pass: bool = False  # whether an NLL forward/backward runs (a dummy one if nll_rows is empty)
    nll_parts: list[list[int]] = field(default_factory=list)  # NLL rows per forward (packed to the budget)
    nll_part_sizes: list[tuple[int, int]] = field(default_factory=list)
    part_rows: list[tuple[tuple[bool, ...], tuple[bool, ...]]] = field(default_factory=list)
    """Per part, per row: is it a peer row, has it a response token (``Norms.is_peer`` / ``has_tokens``)."""
    num_nll_parts: int = 0  # NLL forwards to run (>= len(nll_parts) under lockstep; the rest are dummies)


def _mini_batches(plan: TrainingPlan, skip: torch.Tensor, micro: int, lockstep: bool,
                  max_len: int, budget: int = 0) -> list[_MiniBatch]:
    """Per mini-batch: its active parts and loss normalisers (``max_len``: the constant of
    ``seq-mean-token-sum-norm``, the policy's configured maximum response length, the same for every mini-batch).
    The active rows and the NLL rows are packed into forwards of at most ``budget`` token positions and ``micro``
    rows (``update/packing.py``; 0: no bound).

    In one process the normalisers are the mini-batch's own (docs/methods.md §1), the NLL term's too
    (``nll_num_rows``: its rows in this mini-batch, so the update adds ``coef ·`` their mean NLL, as SGT's
    objective holds per update). Under FSDP lockstep the ranks hold
    different rows of one global mini-batch ``i`` (rank ``r``'s ``i``-th mini-batch): counts are agreed so that every
    rank runs the same number of mini-batches, forwards and NLL passes, the token-mean / sequence-mean / NLL
    normalisers are the *global* counts, and each rank's loss is multiplied by the world size (``scale``). FSDP
    averages gradients over ranks, so the update equals the one-process update on the union of the ranks' rows
    (tested in tests/distributed); the normalisers' floors of 1 apply to the global counts, as in one process.
    """
    batch = plan.batch
    nll_mbs = plan.nll.mini_batches if plan.nll is not None else []
    skipped = skip.tolist()  # one device read, not one per row
    has_tokens = (batch.response_mask.sum(-1) > 0).tolist()
    is_peer = batch.is_peer.tolist()
    prompt, response = lengths(batch)
    nll_prompt, nll_response = lengths(plan.nll.batch) if plan.nll is not None else ([], [])
    budget = budget or _UNBOUNDED
    out = []
    for i, rows in enumerate(plan.mini_batches):
        mask = batch.response_mask[rows] if rows else batch.response_mask[:0]
        active = [j for j, r in enumerate(rows) if not skipped[r]]  # positions in the mini-batch
        nll_rows = list(nll_mbs[i]) if i < len(nll_mbs) else []
        mb_prompt, mb_response = [prompt[r] for r in rows], [response[r] for r in rows]
        parts = pack(active, mb_prompt, mb_response, budget, micro)
        nll_parts = pack(nll_rows, nll_prompt, nll_response, budget, micro)
        out.append(_MiniBatch(
            rows=list(rows), parts=parts, part_sizes=[part_size(p, mb_prompt, mb_response) for p in parts],
            part_rows=[(tuple(bool(is_peer[rows[j]]) for j in p), tuple(bool(has_tokens[rows[j]]) for j in p))
                       for p in parts],
            nll_rows=nll_rows, nll_parts=nll_parts,
            nll_part_sizes=[part_size(p, nll_prompt, nll_response) for p in nll_parts],
            token_count=mask.sum(), num_seqs=sum(has_tokens[r] for r in rows), max_len=max_len,
        ))
    for mb in out:
        mb.num_parts, mb.num_nll_parts, mb.nll_pass = len(mb.parts), len(mb.nll_parts), bool(mb.nll_rows)
        mb.nll_num_rows = float(len(mb.nll_rows))
    if not lockstep:
        return out
    world = rank_and_world()[1]
    m = agree_max([len(out)])[0]
    out += [_MiniBatch(rows=[], parts=[], part_sizes=[], nll_rows=[], token_count=0.0, num_seqs=0, max_len=max_len)
            for _ in range(m - len(out))]
    maxes = agree_max([mb.num_parts for mb in out] + [mb.num_nll_parts for mb in out])
    sums = agree_sum([float(mb.token_count) for mb in out] + [mb.num_seqs for mb in out]
                     + [len(mb.nll_rows) for mb in out])
    for i, mb in enumerate(out):
        mb.num_parts, mb.num_nll_parts = maxes[i], maxes[m + i]
        mb.nll_pass = bool(mb.num_nll_parts)
        mb.token_count = torch.tensor(sums[i])
        mb.num_seqs = sums[m + i]
        mb.nll_num_rows = float(sums[2 * m + i])  # mini-batch i's NLL rows on every rank
        mb.scale = float(world)
    return out


def update_policy(
    policy, plan: TrainingPlan, cfg: GRPOConfig,
    backward: Callable[[torch.Tensor], None], step_optimizer: Callable[[], None], zero_grad: Callable[[], None],
) -> UpdateStats:
    """Run the update of ``plan``; returns its :class:`~mutual_rl.stats.UpdateStats` (the objective's statistics as
    token-weighted means over the tokens trained).

    ``backward``, ``step_optimizer`` and ``zero_grad`` come from the trainer (Lightning's manual optimization).
    First the plan's batch and its NLL batch move to ``policy.device`` (regimes build them on the CPU, as the
    records they come from). Old log-probs are recomputed for the receiver's own rows when
    ``cfg.old_logp == "recompute"`` and, always, for rows the regime marks ``needs_old_logp`` (peer responses
    evaluated under the receiver's own old policy).
    Other peer rows keep the old log-probs their regime set (a THL-aligned peer trace, or the receiver's
    log-probs the regime already computed): recomputing them would discard the trace or repeat the work.

    Never trains on non-finite values: a non-finite advantage refuses the whole update before any forward (``skip``:
    nothing of this policy trains this step, counted once per planned optimizer step); a non-finite
    loss or gradient norm of a mini-batch refuses its optimizer step (``cfg.on_nonfinite``: ``raise`` a
    :class:`NonFiniteUpdateError` naming the policy, the quantity and the likely cause, or ``skip`` the step and
    count it); non-finite weights after the update raise (they can only come from an optimizer step that
    overflowed, e.g. a far too high learning rate). Per-token statistics (entropy, clip fractions, ...) are ``None``
    when no row was trained, never carried over.

    Under FSDP with several processes the ranks run in lockstep with global normalisers (:func:`_mini_batches`),
    and agree on refusing a step.
    """
    plan = _on_device(plan, policy.device)
    batch, objective = plan.batch, resolve(plan.objective, cfg.dapo())
    temperature = policy.spec.sampling.temperature
    params = [p for p in policy.parameters() if p.requires_grad]
    lockstep = in_lockstep(policy)
    refused = _refuse_nonfinite_advantages(policy, plan, cfg, lockstep)
    if refused is not None:
        return refused
    skip = zero_advantage_skip_mask(batch.advantages, cfg.kl_coef) if cfg.skip_zero_advantage \
        else torch.zeros_like(batch.advantages, dtype=torch.bool)
    need = batch.needs_old_logp | ((cfg.old_logp == "recompute") & ~batch.is_peer)
    rows = [i for i, (n, s) in enumerate(zip(need.tolist(), skip.tolist())) if n and not s]  # one read of each mask
    budget = token_budget(policy, cfg.max_tokens_per_micro_batch)
    weights, mismatch = _recompute_and_measure(policy, batch, rows, temperature, cfg, budget)
    mini_batches = _mini_batches(plan, skip, cfg.micro_batch_size, lockstep, int(policy.spec.sampling.max_new_tokens),
                                 budget)
    total = _MiniBatchResult()
    steps_metrics = {"grad_norm": 0.0, "loss": 0.0, "nll": 0.0}
    n_steps, n_skipped, n_updates = 0, 0, 0
    for _ in range(cfg.ppo_epochs):
        for mbi in mini_batches:
            zero_grad()
            res = _forward_backward(policy, plan, mbi, objective, cfg, backward, n_updates, weights)
            for p in params:  # a skipped mini-batch still steps, with zero gradients
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            norm = clip_grad_norm_(params, policy.spec.optimizer.grad_clip or float("inf"), sharded=lockstep)
            (norm,) = res.settle(norm)  # the update's one read of its values
            n_updates += 1
            if not _step_allowed(policy, cfg, res, norm, mbi, plan, n_updates - 1, lockstep):
                zero_grad()
                n_skipped += 1
                continue
            total.absorb(res)
            steps_metrics["loss"] += res.loss
            steps_metrics["nll"] += res.nll
            steps_metrics["grad_norm"] += norm
            step_optimizer()
            policy.version += 1
            n_steps += 1
    if n_steps:
        _check_finite_weights(policy, params, lockstep)
    per_step = {k: v / max(n_steps, 1) for k, v in steps_metrics.items()}
    return UpdateStats(
        trained_tokens=total.tokens, skipped_frac=float(skip.float().mean()) if len(batch) else 0.0,
        loss=per_step["loss"], grad_norm=per_step["grad_norm"], nll=per_step["nll"] if plan.nll is not None else None,
        nonfinite_skipped=float(n_skipped) if cfg.on_nonfinite == "skip" else None, tokens=total.stats(),
        rollout=mismatch)


def _on_device(plan: TrainingPlan, device: torch.device) -> TrainingPlan:
    """``plan`` with its batch and its NLL term's batch on ``device`` (regimes build them on the CPU)."""
    nll = None if plan.nll is None else dataclasses.replace(plan.nll, batch=plan.nll.batch.to(device))
    return dataclasses.replace(plan, batch=plan.batch.to(device), nll=nll)


def _refuse_nonfinite_advantages(policy, plan: TrainingPlan, cfg: GRPOConfig, lockstep: bool) -> UpdateStats | None:
    """A non-finite advantage on any rank refuses the whole update: raise, or (``skip``) the stats of an update
    that trained nothing; ``None`` when every advantage is finite."""
    batch = plan.batch
    bad = not bool(torch.isfinite(batch.advantages).all())
    if lockstep:  # every rank refuses the same updates (each forward of a sharded model is collective)
        bad = bool(agree_max([int(bad)])[0])
    if not bad:
        return None
    rows = (~torch.isfinite(batch.advantages)).nonzero().squeeze(-1).tolist()
    where = f"in rows {rows[:8]} (prompt ids {[batch.prompt_ids[i] for i in rows[:8]]})" if rows else "on another rank"
    if cfg.on_nonfinite == "raise":
        raise NonFiniteUpdateError(_nonfinite_message(
            policy, "advantage", where, _CAUSE_REWARD, "the whole update was refused before any weight changed"))
    return UpdateStats(trained_tokens=0.0, skipped_frac=1.0,
                       nonfinite_skipped=float(cfg.ppo_epochs * len(plan.mini_batches)))


def _recompute_and_measure(policy, batch: PolicyBatch, rows: list[int], temperature: float, cfg: GRPOConfig,
                           budget: int):
    """Recompute the old log-probs of ``rows`` (:func:`recompute_old_logp`); where they replace an engine's trace
    (own rows under ``old_logp: recompute``), the rollout correction's weights ``[B, T]`` (``None`` for ``none``)
    and the mismatch (``algorithms/rollout_correction.py``; local to this rank under FSDP)."""
    engine_logp = batch.old_logp.clone() if cfg.old_logp == "recompute" else None
    recompute_old_logp(policy, batch, rows, temperature, cfg.micro_batch_size, budget)
    if engine_logp is None or not rows:
        return None, None
    measured = torch.zeros(len(batch), dtype=torch.bool, device=batch.old_logp.device)
    measured[rows] = True
    mask = batch.response_mask * (measured & ~batch.is_peer).unsqueeze(-1)
    weights, mismatch = correction_weights(batch.old_logp, engine_logp, mask, cfg.rollout_correction,
                                           cfg.rollout_correction_cap)
    return (None if cfg.rollout_correction == "none" else weights), mismatch


def _weighted_objective(objective: Objective, logp, sub, ref, w, mbi: _MiniBatch, cfg: GRPOConfig,
                        update_index: int, rows: tuple[tuple[bool, ...], tuple[bool, ...]] | None = None):
    """The objective with the rollout correction's weights ``w`` on the behaviour term only: the objective sees
    ``logp`` with each token's gradient scaled by ``w``; a KL term's gradient is restored by a zero-valued term
    (``policy_loss`` with zero advantages: the KL alone, over the same normalisers, with the ``1 − w`` share).
    ``rows``: the part's host flags per row (peer row, has tokens), for :class:`Norms`."""
    norms = Norms(token_count=mbi.token_count, num_seqs=mbi.num_seqs, max_len=mbi.max_len,
                  is_peer=rows[0] if rows else None, has_tokens=rows[1] if rows else None)
    if w is None:
        return objective.loss(logp, sub, norms, ref, update_index)
    loss, stats = objective.loss(behaviour_weighted(logp, w), sub, norms, ref, update_index)
    if cfg.kl_coef:
        restore, _ = policy_loss(
            behaviour_weighted(logp, 1 - w), sub.old_logp, torch.zeros_like(sub.advantages), sub.response_mask,
            clip_low=cfg.clip_low, clip_high=cfg.clip_high, agg=cfg.agg, weights=sub.weights, max_len=mbi.max_len,
            token_count=mbi.token_count, num_seqs=mbi.num_seqs, ref_logp=ref, kl_coef=cfg.kl_coef, kl_kind=cfg.kl_kind)
        loss = loss + (restore - restore.detach())
    return loss, stats


def _forward_backward(policy, plan: TrainingPlan, mbi: _MiniBatch, objective: Objective, cfg: GRPOConfig,
                      backward: Callable[[torch.Tensor], None], update_index: int,
                      weights: torch.Tensor | None = None) -> _MiniBatchResult:
    """Every forward/backward of one mini-batch (its parts, lockstep dummies, then the NLL term), the step's
    optimizer update ``update_index``; ``weights``: the rollout correction's per-token weights of the plan's
    batch."""
    temperature = policy.spec.sampling.temperature
    mb = plan.batch.select(mbi.rows) if mbi.rows else None
    res = _MiniBatchResult()
    for k in range(mbi.num_parts):
        # the KL reference runs first: no other forward may come between a forward and its backward
        # (activation checkpointing recomputes that forward, and LoRA's reference is the same modules)
        if k >= len(mbi.parts):  # lockstep dummy: same passes in the same order, zero loss
            if cfg.kl_coef:
                with torch.no_grad():
                    policy.dummy_logp(temperature, reference=True)
            backward(policy.dummy_logp(temperature).sum() * 0.0)
            continue
        sub = narrow(mb.select(mbi.parts[k]), mbi.part_sizes[k])  # on its own width (update/packing.py)
        ref = None
        if cfg.kl_coef:
            with torch.no_grad():
                ref, _ = policy.response_logp(sub.input_ids, sub.attention_mask, sub.response_width, temperature,
                                              reference=True)
        logp, entropy = policy.response_logp(sub.input_ids, sub.attention_mask, sub.response_width, temperature,
                                             with_entropy=True)
        w = None if weights is None else weights[[mbi.rows[j] for j in mbi.parts[k]]][:, :sub.response_width]
        loss, stats = _weighted_objective(objective, logp, sub, ref, w, mbi, cfg, update_index, mbi.part_rows[k])
        loss = loss * mbi.scale
        backward(loss)
        n_tok = sub.response_mask.sum()  # device values wait for the update's one read (res.settle)
        res.add_tokens(n_tok)
        res.add_stats(stats, n_tok)
        res.add(("rows", "entropy"), masked_mean(entropy, sub.response_mask).detach(), n_tok)
        res.add_loss(loss)
    for k in range(mbi.num_nll_parts):
        if k < len(mbi.nll_parts):
            part = mbi.nll_parts[k]
            extra, mean_nll = nll_loss(policy, plan.nll, part, temperature, mbi.nll_num_rows,
                                       mbi.nll_part_sizes[k])
            extra = extra * mbi.scale
            res.add_nll(mean_nll, len(part), len(mbi.nll_rows))  # the mean over the mini-batch's NLL rows
            res.add_loss(extra)
        else:  # lockstep dummy (another rank has more NLL forwards in this mini-batch)
            extra = policy.dummy_logp(temperature).sum() * 0.0
        backward(extra)
    return res


def _step_allowed(policy, cfg: GRPOConfig, res: _MiniBatchResult, norm: float, mbi: _MiniBatch,
                  plan: TrainingPlan, update_index: int, lockstep: bool) -> bool:
    """Whether this mini-batch's optimizer step may be taken: its loss and gradient norm are finite on every rank.
    Otherwise ``raise`` mode raises :class:`NonFiniteUpdateError`; ``skip`` mode returns False."""
    local_bad = (not res.finite) or not math.isfinite(norm)
    bad = bool(agree_max([int(local_bad)])[0]) if lockstep else local_bad  # every rank refuses the same steps
    if not bad:
        return True
    if cfg.on_nonfinite == "raise":
        if local_bad:
            what = "loss" if not res.finite else "gradient norm"
            prompts = sorted({plan.batch.prompt_ids[r] for r in mbi.rows})[:8]
            where = f"in optimizer update {update_index} of this step (mini-batch of {len(mbi.rows)} rows, " \
                    f"prompt ids {prompts})"
        else:
            what, where = "loss or gradient norm", f"in optimizer update {update_index} on another rank"
        raise NonFiniteUpdateError(_nonfinite_message(
            policy, what, where, _CAUSE_LR,
            "that optimizer step was refused (the weights are those after the previous, finite, step)"))
    return False


def _check_finite_weights(policy, params: list[torch.Tensor], lockstep: bool) -> None:
    """Raise :class:`NonFiniteUpdateError` if any trainable weight is NaN/inf after the update (one reduction)."""
    finite = bool(torch.stack([torch.isfinite(p.detach()).all() for p in params]).all()) if params else True
    if lockstep:
        finite = not agree_max([int(not finite)])[0]
    if not finite:
        names = [n for n, p in policy.named_parameters() if p.requires_grad and not bool(torch.isfinite(p).all())]
        raise NonFiniteUpdateError(
            f"policy {policy.name!r}: non-finite weights after an optimizer step (e.g. {names[:3]}): the step "
            f"overflowed although its loss and gradient were finite. Likely cause: {_CAUSE_LR}. Current "
            f"optimizer.lr = {policy.spec.optimizer.lr:g}; lower it (tiny presets: 5e-5 .. 1e-4).")
