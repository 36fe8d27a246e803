"""Collate rollouts into a :class:`PolicyBatch` (left-padded prompts, right-padded responses)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mutual_rl.types import CrossedRollout, PolicyBatch, Rollout


def collate(
    rollouts: Sequence[Rollout | CrossedRollout],
    advantages: Sequence[float] | torch.Tensor,
    pad_id: int,
    weights: Sequence[float] | torch.Tensor | None = None,
    is_peer: Sequence[bool] | None = None,
    needs_old_logp: Sequence[bool] | torch.Tensor | None = None,
    extras: dict[str, torch.Tensor] | None = None,
) -> PolicyBatch:
    """Rows in the order given; ``old_logp`` is each own rollout's ``logp`` (the sampler's trace) and each crossed
    rollout's ``old_logp`` (the behaviour log-probs its regime set; zeros when ``None``).

    ``is_peer`` defaults to "is a :class:`CrossedRollout`"; ``needs_old_logp`` defaults to "is a crossed
    rollout whose ``old_logp`` is ``None``" (the receiver must recompute its own old log-probs for it).
    """
    n = len(rollouts)
    if n == 0:
        raise ValueError("cannot collate an empty list of rollouts")
    width_p = max(len(r.prompt_ids) for r in rollouts)
    width_t = max(max(len(r.response_ids) for r in rollouts), 1)
    ids = torch.full((n, width_p + width_t), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width_p + width_t), dtype=torch.long)
    mask = torch.zeros((n, width_t))
    old = torch.zeros((n, width_t))
    for i, r in enumerate(rollouts):
        p, t = len(r.prompt_ids), len(r.response_ids)
        ids[i, width_p - p : width_p] = r.prompt_ids
        ids[i, width_p : width_p + t] = r.response_ids
        attn[i, width_p - p : width_p + t] = 1
        mask[i, :t] = 1.0
        behaviour = r.old_logp if isinstance(r, CrossedRollout) else r.logp
        if behaviour is not None:
            old[i, :t] = behaviour.float()
    return PolicyBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=mask,
        old_logp=old,
        advantages=torch.as_tensor(advantages, dtype=torch.float32).reshape(n),
        weights=torch.ones(n) if weights is None else torch.as_tensor(weights, dtype=torch.float32).reshape(n),
        is_peer=torch.tensor([isinstance(r, CrossedRollout) for r in rollouts], dtype=torch.bool)
        if is_peer is None else torch.as_tensor(is_peer, dtype=torch.bool),
        prompt_ids=[r.prompt_id for r in rollouts],
        needs_old_logp=torch.tensor([isinstance(r, CrossedRollout) and r.old_logp is None for r in rollouts],
                                    dtype=torch.bool)
        if needs_old_logp is None else torch.as_tensor(needs_old_logp, dtype=torch.bool),
        extras=dict(extras or {}),
    )
