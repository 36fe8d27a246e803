"""Complementarity between policies (GRAFT Fig. 1): how often one policy solves what another never does.

For an ordered pair (A, B), on the problems *both* were evaluated on in the same evaluation (same k samples per
problem): ``all_fail(A)`` = problems where A has no correct sample among its k (``c_A = 0``), ``solved(A->B)`` =
those where B has at least one (``c_B >= 1``), and the share ``solved(A->B) / all_fail(A)`` — the fraction of A's
all-fail prompts that B solves (NaN when A has no all-fail problem: the share is undefined, not 0). Computed for
every ordered pair, so both directions ("and vice versa") are reported.

Flat keys (what the module logs as they are)::

    complementarity/<A>-><B>                 share
    complementarity/<A>-><B>/all_fail        #A's all-fail problems (the denominator)
    complementarity/<A>-><B>/solved          #those B solves
    complementarity/<A>-><B>/mixed_frac      share of A's all-fail problems where B's group is mixed (1 <= c_B < k)
    complementarity/<A>-><B>/all_pass_frac   share where every one of B's samples is correct (c_B = k)

The last two say what GRAFT can use (docs/methods.md §5.5): it grafts only *mixed* peer groups onto a receiver's
all-fail prompt, so a peer that is all-pass there (an expert on the receiver's gaps) gives it nothing to graft,
while SGT and PRP still learn from it. They are NaN, like the share, when A has no all-fail problem.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from mutual_rl.evaluation.metrics import ComplementarityCounts
from mutual_rl.names import complementarity as name
from mutual_rl.names import flow


def complementarity_table(names: Sequence[str], all_fail: torch.Tensor, solved: torch.Tensor,
                          all_pass: torch.Tensor | None = None) -> dict[str, float]:
    """Flat metrics (module docstring) from ``all_fail`` [N], ``solved`` and ``all_pass`` [N, N] of policies
    ``names`` (the two ``_frac`` keys only when ``all_pass`` is given)."""
    out: dict[str, float] = {}
    for a, name_a in enumerate(names):
        for b, name_b in enumerate(names):
            if a == b:
                continue
            d = flow(name_a, name_b)
            fail, ok = int(all_fail[a]), int(solved[a, b])
            out[name(d)] = ok / fail if fail else float("nan")
            out[name(d, "all_fail")] = float(fail)
            out[name(d, "solved")] = float(ok)
            if all_pass is not None:
                full = int(all_pass[a, b])
                out[name(d, "mixed_frac")] = (ok - full) / fail if fail else float("nan")
                out[name(d, "all_pass_frac")] = full / fail if fail else float("nan")
    return out


def complementarity(correct: Mapping[str, Mapping[int, int]],
                    samples: int | Mapping[str, Mapping[int, int]] | None = None) -> dict[str, float]:
    """Complementarity of every ordered policy pair from per-problem correct counts.

    correct: ``{policy: {prompt_id: c}}``, ``c`` = correct samples of that policy on that problem. samples: the
    samples per problem, one number for all or ``{policy: {prompt_id: n}}`` (needed for the mixed / all-pass
    shares). Only problems present for every policy count. Returns the flat keys of the module docstring (empty
    for < 2 policies).
    """
    names = list(correct)
    if len(names) < 2:
        return {}
    common = set.intersection(*(set(v) for v in correct.values()))
    ids = sorted(common)
    table = torch.tensor([[int(correct[n][i]) for n in names] for i in ids], dtype=torch.long).reshape(-1, len(names))
    n = None
    if samples is not None:
        n = (torch.full_like(table, int(samples)) if isinstance(samples, int) else
             torch.tensor([[int(samples[m][i]) for m in names] for i in ids], dtype=torch.long).reshape(table.shape))
    metric = ComplementarityCounts(len(names), sync_on_compute=False)
    metric.update(table, n)
    all_fail, solved, all_pass = metric.compute()
    return complementarity_table(names, all_fail, solved, all_pass if n is not None else None)
