"""Truncated importance-sampling policy gradient for off-policy (peer) tokens (docs/methods.md §5.2).

Per token with ``ρ_t = exp(clamp(logp_t − behaviour_t, ±20))`` and cap ``C``::

    ℓ_t = −sg(min(ρ_t, C)) · Â · exp(logp_t − sg(logp_t))

value ``−min(ρ_t, C)·Â``, gradient ``−min(ρ_t, C)·Â·∇logp_t``: the weight is capped, never the update direction
(no PPO clip). Per-sequence ``weights`` multiply it, a KL penalty is added as in DAPO, and the aggregation takes the
mini-batch's global normalisers, so micro-batches sum to the mini-batch loss. *(ours: the Mutual RL paper says
"truncated importance weights" without an equation.)*
"""

from __future__ import annotations

import torch

from mutual_rl.algorithms.aggregation import aggregate
from mutual_rl.algorithms.kl import kl_penalty
from mutual_rl.algorithms.masking import masked_mean

__all__ = ["truncated_is_loss"]

_LOG_RATIO_CLAMP = 20.0


def truncated_is_loss(logp, behaviour_logp, advantages, mask, is_cap, agg, weights, max_len, token_count,
                      num_seqs, ref_logp=None, kl_coef=0.0, kl_kind="k3"):
    """Truncated-IS policy-gradient loss of peer rows (see module doc) and its per-token metrics.

    logp, behaviour_logp, mask: ``[b, T]``; advantages, weights: ``[b]``; returns ``(loss, metrics)``.
    """
    m = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    rho = torch.exp((logp.detach() - behaviour_logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))  # [b, T]
    w_is = rho.clamp(max=is_cap)
    loss_mat = -w_is * adv * torch.exp(logp - logp.detach())
    if kl_coef:
        loss_mat = loss_mat + kl_coef * kl_penalty(logp, ref_logp, kl_kind)
    loss_mat = loss_mat * weights.to(logp.dtype).unsqueeze(-1)
    loss = aggregate(loss_mat, m, agg, max_len=max_len, token_count=token_count, num_seqs=num_seqs)
    metrics = {
        "peer/ratio_mean": masked_mean(rho, m),
        "peer/is_abs_dev": masked_mean((rho - 1).abs(), m),
        "peer/is_trunc_frac": masked_mean((rho > is_cap).to(logp.dtype), m),
        "peer/num_tokens": m.sum(),
    }
    return loss, metrics
