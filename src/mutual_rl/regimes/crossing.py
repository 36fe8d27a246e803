"""Carry peer rollouts into a receiver's tokenization (THL): text crossing and, on request, trace alignment.

The receiver's prompt ids come from its *own* group for the same prompt (its prompt format, its BOS); the
response crosses as text (``Rollout.response_text``: special tokens skipped, terminal EOS removed) and is encoded
by the receiver without special tokens, with the receiver's EOS appended iff the source stopped on EOS.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mutual_rl.names import THL_STATS, thl
from mutual_rl.thl import align_traces, alignment_groups, residual_report
from mutual_rl.thl.offsets import encode_batch_with_offsets
from mutual_rl.types import CrossedRollout, Rollout, collate
from mutual_rl.update.lockstep import padded


def cross_rollouts(
    receiver, rollouts: Sequence[Rollout], prompt_ids: dict[int, torch.Tensor], granularity: str | None = None
) -> list[CrossedRollout]:
    """``rollouts`` (a peer's) in ``receiver``'s tokenization.

    prompt_ids: the receiver's prompt ids per ``prompt_id`` (from its own rollouts of this step).
    granularity: ``"word"`` / ``"span"`` to align each source trace onto the receiver tokens (docs/methods.md §2.2);
        ``None`` leaves ``source_logp`` zero and ``aligned`` False. ``old_logp`` stays ``None`` either way: the
        regime decides the behaviour log-probs (``None``: the receiver recomputes its own).
    """
    tok = receiver.tokenizer
    encoded = []
    for r in rollouts:
        if r.prompt_id not in prompt_ids:
            raise KeyError(f"receiver {receiver.name!r} has no prompt ids for prompt {r.prompt_id} "
                           f"(peer {r.policy_id!r}); peers must answer the receiver's prompts")
    for r, (ids, offsets) in zip(rollouts, encode_batch_with_offsets(tok, [r.response_text for r in rollouts])):
        if r.finish_reason == "eos":
            ids = ids + [int(tok.eos_token_id)]
            offsets = offsets + [(len(r.response_text), len(r.response_text))]
        encoded.append((ids, offsets))
    if granularity is not None and rollouts:
        traces = align_traces(
            [r.response_text for r in rollouts], [list(r.offsets) for r in rollouts],
            [r.logp for r in rollouts], [offs for _, offs in encoded], granularity=granularity,
        )
    else:
        traces = [torch.zeros(len(ids)) for ids, _ in encoded]
    return [
        CrossedRollout(
            source=r, receiver_id=receiver.name, prompt_ids=prompt_ids[r.prompt_id],
            response_ids=torch.tensor(ids, dtype=torch.long), offsets=tuple(offs),
            source_logp=trace.float(), aligned=granularity is not None,
        )
        for r, (ids, offs), trace in zip(rollouts, encoded, traces)
    ]


def receiver_prompt_ids(own_groups) -> dict[int, torch.Tensor]:
    """prompt_id -> the receiver's prompt ids, from its own groups."""
    return {g.prompt_id: g.rollouts[0].prompt_ids for g in own_groups if g.rollouts}


@torch.no_grad()
def receiver_logp(receiver, crossed: Sequence[CrossedRollout], batch_size: int = 16) -> list[torch.Tensor]:
    """Per crossed row: the receiver's log-probs ``[T]`` of its response tokens, on the CPU as the records (current
    weights, the receiver's sampling temperature), in forwards of ``batch_size`` rows (0 = all at once).

    Under FSDP with several ranks every rank runs as many forwards as the busiest one (dummies), so every rank
    must call this, with or without rows."""
    temperature = receiver.spec.sampling.temperature
    size = batch_size or max(len(crossed), 1)
    chunks = padded(receiver, list(range(0, len(crossed), size)))
    for _ in range(sum(c is None for c in chunks)):  # lockstep dummies (another rank has more forwards)
        receiver.dummy_logp(temperature)
    starts = [c for c in chunks if c is not None]
    if not crossed:
        return []
    batch = collate(list(crossed), torch.zeros(len(crossed)), receiver.tokenizer.pad_token_id)
    out: list[torch.Tensor] = []
    for start in starts:
        sub = batch.select(list(range(start, min(start + size, len(crossed)))))
        logp, _ = receiver.response_logp(sub.input_ids, sub.attention_mask, batch.response_width, temperature)
        logp = logp.detach().float().cpu()  # records live on the CPU
        for row, c in enumerate(crossed[start:start + size]):
            out.append(logp[row, : len(c.response_ids)].clone())
    return out


def thl_residual(receiver, crossed: Sequence[CrossedRollout], granularity: str = "word",
                 batch_size: int = 16) -> dict[str, float]:
    """How well the THL-aligned peer traces match the receiver's own log-probs, per direction ``<source>-><R>``.

    For every crossed response: the source's sampled trace aligned onto the receiver's tokens (``granularity``)
    against the receiver's log-probs of those tokens (:func:`receiver_logp`, under the current weights), through
    :func:`mutual_rl.thl.residual_report`. Metrics ``thl/<source>-><R>/residual_mean``, ``residual_p90``,
    ``residual_max`` (nats per token) and ``group_count_mismatch`` (share of alignment groups whose token counts
    differ). Runs one no-grad receiver forward over the rows (every rank must call it under FSDP)."""
    own = receiver_logp(receiver, crossed, batch_size)
    if not crossed:
        return {}
    texts = [c.source.response_text for c in crossed]
    aligned = align_traces(texts, [list(c.source.offsets) for c in crossed], [c.source.logp for c in crossed],
                           [list(c.offsets) for c in crossed], granularity=granularity)
    out: dict[str, float] = {}
    for src in dict.fromkeys(c.policy_id for c in crossed):
        idx = [i for i, c in enumerate(crossed) if c.policy_id == src]
        groups = [alignment_groups(texts[i], list(crossed[i].source.offsets), list(crossed[i].offsets), granularity)
                  for i in idx]
        rep = residual_report([aligned[i] for i in idx], [own[i] for i in idx], groups)
        for k in THL_STATS:
            out[thl(src, receiver.name, k)] = rep[k]
    return out
