"""GRAFT's compatibility gate measured at several thresholds at once: is the regime tested in its premise?

GRAFT admits a peer response when ``s = exp(ℓ̄_R − ℓ̄_S) > δ`` (``regimes/graft.py``), with ``ℓ̄`` the *per-token
mean* log-probability under the receiver and under the source. How much the gate lets through depends on δ and on
the response length: on 3-4-token answers a receiver that failed all its samples rarely gives the peer's answer
a per-token mean close to the peer's own, so δ = 0.8 admits under 1 % of the peer's successes; on worked
solutions most tokens are steps both policies predict well and the mean moves towards the source's. δ's value is
not in the text of the paper available to us: the gate is measured, not assumed.

Every GRAFT plan that scores responses logs, besides the admissions at its own δ, the admissions at each δ of
:data:`GATE_DELTAS` and quantiles of ``s``, split by the peer response's outcome, as plain shares of the responses
it evaluated (the candidate groups of this step, before any weighting): ``gate/admit_<kind>@<δ>`` (share with
``s > δ``) and ``gate/s_p<q>_<kind>`` for ``q`` in :data:`QUANTILES` (``kind``: ``success`` or ``failure``; absent
when the step evaluated no response of that kind). The values do not depend on the regime's own δ, so a one-step
GRAFT run with a large batch measures the gate before δ is chosen (docs/methods.md), and the comparison's
diagnostics show them at step 0 for every GRAFT run.
"""

from __future__ import annotations

import torch

GATE_DELTAS = (0.3, 0.5, 0.7, 0.8, 0.9)
"""The thresholds at which the gate's admissions are logged."""
QUANTILES = (10, 25, 50, 75, 90)
"""The percentiles of ``s`` logged per outcome."""
KINDS = ("success", "failure")


def admit_tag(kind: str, delta: float) -> str:
    """``gate/admit_<kind>@<δ>``, e.g. ``gate/admit_success@0.8``."""
    return f"gate/admit_{kind}@{delta:g}"


def quantile_tag(kind: str, q: int) -> str:
    """``gate/s_p<q>_<kind>``, e.g. ``gate/s_p50_failure``."""
    return f"gate/s_p{q}_{kind}"


def gate_grid(s: torch.Tensor, success: torch.Tensor) -> dict[str, float]:
    """The gate's admissions at every δ of :data:`GATE_DELTAS` and the quantiles of ``s``, per outcome.

    ``s`` ``[n]``: the compatibility scores of the evaluated peer responses; ``success`` ``[n]`` bool: whether each
    was a success. Per kind with at least one response: ``admit_tag(kind, δ)`` = the share with ``s > δ`` (strict,
    as the gate) and ``quantile_tag(kind, q)`` = the ``q``-th percentile (linear interpolation, torch.quantile)."""
    s = torch.as_tensor(s, dtype=torch.float64).reshape(-1)
    success = torch.as_tensor(success, dtype=torch.bool).reshape(-1)
    if s.shape != success.shape:
        raise ValueError(f"gate_grid: {s.numel()} scores but {success.numel()} outcomes")
    out: dict[str, float] = {}
    for kind, mask in (("success", success), ("failure", ~success)):
        vals = s[mask]
        if not vals.numel():
            continue
        for delta in GATE_DELTAS:
            out[admit_tag(kind, delta)] = float((vals > delta).double().mean())
        qs = torch.quantile(vals, torch.tensor([q / 100 for q in QUANTILES], dtype=torch.float64))
        for q, v in zip(QUANTILES, qs.tolist()):
            out[quantile_tag(kind, q)] = float(v)
    return out


def compatibility_score(receiver_mean_logp, source_mean_logp) -> torch.Tensor:
    """``s = exp(ℓ̄_R − ℓ̄_S)`` (tensors or floats, broadcast) as a float tensor."""
    r = torch.as_tensor(receiver_mean_logp, dtype=torch.float64)
    s = torch.as_tensor(source_mean_logp, dtype=torch.float64)
    return torch.exp(r - s)


def compatibility_weight(receiver_mean_logp, source_mean_logp, delta: float = 0.8) -> torch.Tensor:
    """GRAFT weight ``w = 1[s > δ] · min(s, 1)`` with ``s = exp(ℓ̄_R − ℓ̄_S)``; ``s ≤ δ`` gives ``w = 0``."""
    s = compatibility_score(receiver_mean_logp, source_mean_logp)
    return torch.where(s > delta, s.clamp(max=1.0), torch.zeros_like(s))
