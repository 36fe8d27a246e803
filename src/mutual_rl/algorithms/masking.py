"""Masked reductions and token entropy (pure tensor functions).

Shapes: ``B`` sequences, ``T`` token positions, ``V`` vocabulary. A ``mask`` is 1 (or True) on response tokens
and 0 on prompt / padding positions.
"""

from __future__ import annotations

import torch

__all__ = ["masked_sum", "masked_mean", "token_entropy"]


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``Σ x · mask`` over ``dim`` (all dims if None). ``x``, ``mask``: same shape (mask is cast to x's dtype)."""
    m = mask.to(x.dtype)
    return (x * m).sum() if dim is None else (x * m).sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``Σ x · mask / Σ mask`` over ``dim`` (all dims if None); an empty mask gives 0, never NaN.

    E.g. ``masked_mean(logp, mask, dim=-1)`` is the mean token log-prob per sequence, ``[B, T] -> [B]``.
    """
    m = mask.to(x.dtype)
    num = (x * m).sum() if dim is None else (x * m).sum(dim=dim)
    den = m.sum() if dim is None else m.sum(dim=dim)
    return num / den.clamp(min=1.0)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over the last dim: ``[..., V] -> [...]`` (e.g. ``[B, T, V] -> [B, T]``).

    Computed stably as ``H = logsumexp(z) − Σ_v softmax(z)_v · z_v`` (no ``log`` of a probability, so no
    ``0 · log 0`` NaN; same formula as verl's ``entropy_from_logits``).
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
