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
from mutual_rl.types import CrossedRollout, Rollout


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


def thl_residual(crossed: Sequence[CrossedRollout], own: Sequence[torch.Tensor],
                 granularity: str = "word") -> dict[str, float]:
    """How well the THL-aligned peer traces match the receiver's own log-probs, per direction ``<source>-><R>``.

    For every crossed response: the source's sampled trace aligned onto the receiver's tokens (``granularity``)
    against ``own``, the receiver's log-probs of those tokens under its current weights (one ``[T]`` per crossed
    row, computed by the step: ``mutual_rl.step.scoring.receiver_logp``), through
    :func:`mutual_rl.thl.residual_report`. Metrics ``thl/<source>-><R>/residual_mean``, ``residual_p90``,
    ``residual_max`` (nats per token) and ``group_count_mismatch`` (share of alignment groups whose token counts
    differ)."""
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
            out[thl(src, crossed[idx[0]].receiver_id, k)] = rep[k]
    return out
