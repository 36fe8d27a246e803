"""Supervised warm-up of a tiny preset so that RL has signal from the first step.

Loss: next-token cross-entropy on the answer tokens and the EOS only (prompt tokens are context), AdamW at a
constant learning rate, batches drawn with replacement from the task's train split filtered by skill
(docs/calibration.md: ~300 steps at lr 1e-3, batch 64 give ~50 % greedy / ~25 % sampled pass@1 on 2-digit addition).
Prompt and answer are tokenized separately and concatenated, exactly as rollouts are (prompt with the
tokenizer's special tokens, answer without), so warm-up and RL see the same token layout.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import torch
from tqdm.auto import tqdm

from mutual_rl.data.task import Problem
from mutual_rl.policies.spec import WarmStart


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


def encode_example(tokenizer, prompt: str, target: str) -> tuple[list[int], int]:
    """Token ids of prompt + target + EOS and the index where the target starts."""
    p = tokenizer(prompt)["input_ids"]
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
) -> list[float]:
    """Train ``model`` in place on ``problems``; returns the loss per step."""
    pool = select_problems(problems, spec)
    if not pool:
        raise ValueError("warm-start has no problems to learn from; check warmstart.skills and the task.")
    examples = [encode_example(tokenizer, render_prompt(p.problem), target_text(p)) for p in pool]
    rng = random.Random(spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in tqdm(range(spec.steps), desc=desc, leave=False):
        batch = [examples[rng.randrange(len(examples))] for _ in range(spec.batch_size)]
        ids, labels, attn = _collate(batch, tokenizer.pad_token_id)
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.detach().item())
    model.eval()
    return losses


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
