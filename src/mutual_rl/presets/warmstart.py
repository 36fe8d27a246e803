"""Supervised warm-up of a tiny preset so that RL has signal from the first step.

Loss: next-token cross-entropy on the answer tokens and the EOS only (prompt tokens are context), AdamW at
``spec.lr`` with ``spec.schedule`` (constant, or cosine decay to ``min_lr_ratio * lr`` at the last step), batches
drawn with replacement from the task's train split filtered by skill (seeded by ``spec.seed``).
Prompt and answer are tokenized separately and concatenated, exactly as rollouts are (the prompt by the policy's
own prompt encoder -- ``mutual_rl.thl.retokenize.prompt_ids``, with its chat template when the policy sets
``chat_template`` -- the answer without special tokens), so warm-up and RL see the same token layout.

The loss runs the LM head only on the target positions (the base model's hidden states there, then the output
embedding): with a 151k-token vocabulary (tiny:qwen-vocab) full logits for every position of a batch would cost
most of the step. Equal to the loss from full logits (tested).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import torch
from tqdm.auto import tqdm

from mutual_rl.model.spec import WarmStart
from mutual_rl.types import Problem


def select_problems(problems: Sequence[Problem], spec: WarmStart) -> list[Problem]:
    """The warm-up pool: ``spec.skills`` plus ``other_skill_fraction`` of the rest (deterministic)."""
    if spec.skills is None:
        return list(problems)
    known = sorted({p.skill for p in problems})
    unknown = [s for s in spec.skills if s not in known]
    if unknown:
        raise ValueError(f"warmstart.skills {unknown} not in the task's skills {known}; fix warmstart.skills.")
    own = [p for p in problems if p.skill in spec.skills]
    rest = [p for p in problems if p.skill not in spec.skills]
    k = round(len(own) * spec.other_skill_fraction / max(1e-9, 1 - spec.other_skill_fraction))
    rng = random.Random(spec.seed)
    return own + rng.sample(rest, min(k, len(rest))) if spec.other_skill_fraction > 0 else own


def encode_example(tokenizer, prompt: str, target: str,
                   encode_prompt: Callable[[str], list[int]] | None = None) -> tuple[list[int], int]:
    """Token ids of prompt + target + EOS and the index where the target starts. ``encode_prompt``: the prompt's
    ids (default: ``prompt_ids(tokenizer, prompt)``, as a policy without chat template encodes it)."""
    if encode_prompt is None:
        from mutual_rl.thl.retokenize import prompt_ids

        p = prompt_ids(tokenizer, prompt)
    else:
        p = list(encode_prompt(prompt))
    t = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return p + t, len(p)


def warm_start(
    model,
    tokenizer,
    problems: Sequence[Problem],
    render_prompt: Callable[[str], str],
    target_text: Callable[[Problem], str],
    spec: WarmStart,
    desc: str = "warm-start",
    encode_prompt: Callable[[str], list[int]] | None = None,
    on_step: Callable[[int, list[float]], None] | None = None,
) -> list[float]:
    """Train ``model`` in place on ``problems``; returns the loss per step. ``encode_prompt``: as in
    :func:`encode_example` (pass the policy's encoder so that warm-up sees the prompt tokens rollouts see).
    ``on_step(steps_done, losses)`` runs after every optimizer step (``scripts/warmup_curve.py`` reports and stores
    checkpoints there; it must leave the model in train mode)."""
    pool = select_problems(problems, spec)
    if not pool:
        raise ValueError("warm-start has no problems to learn from; check warmstart.skills and the task.")
    examples = [encode_example(tokenizer, render_prompt(p.problem), target_text(p), encode_prompt) for p in pool]
    rng = random.Random(spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
    model.train()
    losses = []
    for step in tqdm(range(spec.steps), desc=desc, leave=False):
        for group in opt.param_groups:
            group["lr"] = warmup_lr(spec, step)
        batch = [examples[rng.randrange(len(examples))] for _ in range(spec.batch_size)]
        ids, labels, attn = _collate(batch, tokenizer.pad_token_id)
        loss = target_loss(model, ids, attn, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.detach().item())
        if on_step is not None:
            on_step(step + 1, losses)
    model.eval()
    return losses


def warmup_lr(spec: WarmStart, step: int) -> float:
    """Learning rate of warm-up step ``step`` (0-based): ``lr``, or for ``cosine``
    ``lr * (r + (1 - r) * (1 + cos(pi * step / (steps - 1))) / 2)`` with ``r = min_lr_ratio`` (lr at step 0,
    ``r * lr`` at the last step)."""
    if spec.schedule == "constant" or spec.steps <= 1:
        return spec.lr
    r = spec.min_lr_ratio
    return spec.lr * (r + (1 - r) * (1 + math.cos(math.pi * step / (spec.steps - 1))) / 2)


def target_loss(model, ids: torch.Tensor, attn: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the positions whose label is not -100, with the LM head applied to
    those positions only (module docstring). Falls back to full logits for a model whose output is more than
    ``lm_head(last hidden state)`` (a final logit scale or soft-cap) or that does not expose its parts."""
    predicts = labels[:, 1:] != -100  # [B, L-1]: position t predicts token t+1
    targets = labels[:, 1:][predicts]  # [N]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    base = getattr(model, "base_model", None)
    plain = head is not None and base is not None and base is not model and not any(
        getattr(model.config, k, None) not in (None, 1.0) for k in ("final_logit_softcapping", "logit_scale"))
    if not plain:
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        return torch.nn.functional.cross_entropy(logits[predicts].float(), targets)
    hidden = base(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1]  # [B, L-1, H]
    return torch.nn.functional.cross_entropy(head(hidden[predicts]).float(), targets)


def _collate(batch: list[tuple[list[int], int]], pad_id: int):
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (seq, start) in enumerate(batch):  # right padding: positions of real tokens start at 0
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, start : len(seq)] = torch.tensor(seq[start:])
        attn[i, : len(seq)] = 1
    return ids, labels, attn
