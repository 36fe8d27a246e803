"""Loss aggregation modes: ``[B, T]`` per-token losses -> scalar (docs/methods.md §1).

Every mode is a *sum over this call's sequences divided by a normaliser*, and the normaliser can be given
globally, so the loss is micro-batch invariant: split a mini-batch into micro-batches, pass each call the
mini-batch's ``token_count`` (token-mean) or ``num_seqs`` (seq-mean modes), and the micro-batch losses sum
exactly to the full mini-batch loss (hence the gradients too). Never divide again by the number of
gradient-accumulation steps. ``None`` means "use this call's own count".

As implemented (``M`` = mask, ``L`` = loss_mat):

- ``token-mean`` (default; DAPO): ``Σ_{b,t} L·M / token_count``, ``token_count`` defaults to ``Σ M``.
- ``seq-mean-token-mean``: ``Σ_b [Σ_t L·M / Σ_t M] / num_seqs``; ``num_seqs`` defaults to the number of
  sequences with at least one response token (a sequence with none contributes 0 and is not counted).
- ``seq-mean-token-sum-norm`` (Dr.GRPO): ``Σ_b [Σ_t L·M / max_len] / num_seqs``; ``max_len`` (the constant
  max response length) is required; ``num_seqs`` defaults to the same count as above. Deviation from verl,
  whose version is ``Σ_{b,t} L·M / T`` (no division by the number of sequences): we follow Dr.GRPO's
  "mean over sequences of token sums / max_len".

A normaliser of 0 (empty mask) is treated as 1, so the loss is 0, never NaN.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["AGGREGATIONS", "aggregate"]


def _den(value: float | int | torch.Tensor | None, default: torch.Tensor) -> torch.Tensor | float:
    if value is None:
        return default.clamp(min=1.0)
    return max(float(value), 1.0) if not isinstance(value, torch.Tensor) else value.clamp(min=1.0)


def _seq_count(m: torch.Tensor) -> torch.Tensor:
    return (m.sum(dim=-1) > 0).to(m.dtype).sum()


def _token_mean(loss, m, max_len, token_count, num_seqs):
    return (loss * m).sum() / _den(token_count, m.sum())


def _seq_mean_token_mean(loss, m, max_len, token_count, num_seqs):
    per_seq = (loss * m).sum(dim=-1) / m.sum(dim=-1).clamp(min=1.0)
    return per_seq.sum() / _den(num_seqs, _seq_count(m))


def _seq_mean_token_sum_norm(loss, m, max_len, token_count, num_seqs):
    if max_len is None or max_len <= 0:
        raise ValueError("aggregation 'seq-mean-token-sum-norm' needs max_len > 0 (the max response length)")
    per_seq = (loss * m).sum(dim=-1) / float(max_len)
    return per_seq.sum() / _den(num_seqs, _seq_count(m))


#: Registry: name -> ``fn(loss_mat [B, T], mask [B, T] float, max_len, token_count, num_seqs) -> scalar``.
AGGREGATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}


def resolve_aggregation(mode: str) -> Callable[..., torch.Tensor]:
    """Return the aggregation registered as ``mode``; ``ValueError`` listing the choices otherwise."""
    try:
        return AGGREGATIONS[mode]
    except KeyError:
        raise ValueError(f"unknown aggregation mode {mode!r}; choices: {sorted(AGGREGATIONS)}") from None


def aggregate(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    max_len: int | None = None,
    token_count: float | int | torch.Tensor | None = None,
    num_seqs: float | int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Aggregate per-token losses ``loss_mat [B, T]`` over response tokens ``mask [B, T]`` to a scalar.

    ``token_count``: global response-token count (token-mean); ``num_seqs``: global sequence count (seq-mean
    modes); ``max_len``: constant normaliser (required by ``seq-mean-token-sum-norm``). See the module doc.
    """
    fn = resolve_aggregation(mode)
    if loss_mat.dim() != 2 or loss_mat.shape != mask.shape:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} must both be [B, T]")
    return fn(loss_mat, mask.to(loss_mat.dtype), max_len, token_count, num_seqs)
