"""THL residual report (docs/methods.md §2.2): how far the aligned peer trace is from the receiver's own log-probs."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mutual_rl.thl.align import AlignmentGroup


def residual_report(aligned: torch.Tensor | Sequence[torch.Tensor],
                    receiver_logp: torch.Tensor | Sequence[torch.Tensor],
                    groups: Sequence[AlignmentGroup] | Sequence[Sequence[AlignmentGroup]] | None = None,
                    ) -> dict[str, float]:
    """Residual metrics for logging, over one response or a batch (lists are concatenated).

    Per token ``r_t = |aligned_t - receiver_logp_t|`` (``aligned`` ``[T]``: the THL-aligned source trace,
    ``receiver_logp`` ``[T]``: the receiver's own log-probs of the same tokens), computed in float64:

    - ``residual_mean``, ``residual_max``, ``residual_p90`` (linear-interpolated quantile) of ``r_t``;
    - ``group_count_mismatch``: share of groups with ``|T_g| != |S_g|`` (needs ``groups``, one list of
      :class:`~mutual_rl.thl.align.AlignmentGroup` per response for a batch);
    - ``num_tokens``, ``num_groups``.

    Empty input gives zeros.
    """
    if not isinstance(aligned, torch.Tensor):
        aligned = torch.cat([a.reshape(-1) for a in aligned]) if len(aligned) else torch.zeros(0)
    if not isinstance(receiver_logp, torch.Tensor):
        receiver_logp = (torch.cat([a.reshape(-1) for a in receiver_logp]) if len(receiver_logp)
                         else torch.zeros(0))
    if aligned.shape != receiver_logp.shape:
        raise ValueError(f"aligned {tuple(aligned.shape)} and receiver_logp {tuple(receiver_logp.shape)} differ")
    r = (aligned.detach().double() - receiver_logp.detach().double()).abs().reshape(-1)  # [T]
    out = {"residual_mean": 0.0, "residual_max": 0.0, "residual_p90": 0.0, "num_tokens": float(r.numel())}
    if r.numel():
        out.update(residual_mean=r.mean().item(), residual_max=r.max().item(),
                   residual_p90=torch.quantile(r, 0.9).item())
    if groups is not None:
        flat: list[AlignmentGroup] = []
        for g in groups:
            if isinstance(g, AlignmentGroup):
                flat.append(g)
            else:
                flat.extend(g)
        mismatch = sum(len(g.source) != len(g.target) for g in flat)
        out["num_groups"] = float(len(flat))
        out["group_count_mismatch"] = mismatch / len(flat) if flat else 0.0
    return out
