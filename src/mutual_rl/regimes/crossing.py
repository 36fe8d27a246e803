"""Carry peer rollouts into a receiver's tokenization (THL): text crossing and, on request, trace alignment.

The receiver's prompt ids come from its *own* group for the same prompt (its prompt format, its BOS); the
response crosses as text (``Rollout.response_text``: special tokens skipped, terminal EOS removed) and is encoded
by the receiver without special tokens, with the receiver's EOS appended iff the source stopped on EOS.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mutual_rl.thl import align_traces
from mutual_rl.thl.offsets import encode_batch_with_offsets
from mutual_rl.types import CrossedRollout, Rollout


def cross_rollouts(
    receiver, rollouts: Sequence[Rollout], prompt_ids: dict[int, torch.Tensor], granularity: str | None = None
) -> list[CrossedRollout]:
    """``rollouts`` (a peer's) in ``receiver``'s tokenization.

    prompt_ids: the receiver's prompt ids per ``prompt_id`` (from its own rollouts of this step).
    granularity: ``"word"`` / ``"span"`` to align each source trace onto the receiver tokens (THL §2.2);
        ``None`` leaves ``logp`` zero and ``aligned`` False (the receiver recomputes its own log-probs).
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
            logp=trace.float(), aligned=granularity is not None,
        )
        for r, (ids, offs), trace in zip(rollouts, encoded, traces)
    ]


def receiver_prompt_ids(own_groups) -> dict[int, torch.Tensor]:
    """prompt_id -> the receiver's prompt ids, from its own groups."""
    return {g.prompt_id: g.rollouts[0].prompt_ids for g in own_groups if g.rollouts}
