"""Complementarity between policies (GRAFT Fig. 1): how often one policy solves what another never does.

For an ordered pair (A, B), on the problems *both* were evaluated on in the same evaluation (same k samples per
problem): ``all_fail(A)`` = problems where A has no correct sample among its k (``c_A = 0``), ``solved(A->B)`` =
those where B has at least one (``c_B >= 1``), and the share ``solved(A->B) / all_fail(A)`` — the fraction of A's
all-fail prompts that B solves (NaN when A has no all-fail problem: the share is undefined, not 0). Computed for
every ordered pair, so both directions ("and vice versa") are reported.

Flat keys (what the module logs as they are)::

    complementarity/<A>-><B>            share
    complementarity/<A>-><B>/all_fail   #A's all-fail problems (the denominator)
    complementarity/<A>-><B>/solved     #those B solves
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from mutual_rl.evaluation.metrics import ComplementarityCounts

PREFIX = "complementarity"


def complementarity_table(names: Sequence[str], all_fail: torch.Tensor, solved: torch.Tensor) -> dict[str, float]:
    """Flat metrics (module docstring) from ``all_fail`` [N] and ``solved`` [N, N] of policies ``names``."""
    out: dict[str, float] = {}
    for a, name_a in enumerate(names):
        for b, name_b in enumerate(names):
            if a == b:
                continue
            key = f"{PREFIX}/{name_a}->{name_b}"
            fail, ok = int(all_fail[a]), int(solved[a, b])
            out[key] = ok / fail if fail else float("nan")
            out[f"{key}/all_fail"] = float(fail)
            out[f"{key}/solved"] = float(ok)
    return out


def complementarity(correct: Mapping[str, Mapping[int, int]]) -> dict[str, float]:
    """Complementarity of every ordered policy pair from per-problem correct counts.

    correct: ``{policy: {prompt_id: c}}``, ``c`` = correct samples of that policy on that problem. Only problems
    present for every policy count. Returns the flat keys of the module docstring (empty for < 2 policies).
    """
    names = list(correct)
    if len(names) < 2:
        return {}
    common = set.intersection(*(set(v) for v in correct.values()))
    ids = sorted(common)
    table = torch.tensor([[int(correct[n][i]) for n in names] for i in ids], dtype=torch.long).reshape(-1, len(names))
    metric = ComplementarityCounts(len(names), sync_on_compute=False)
    metric.update(table)
    all_fail, solved = metric.compute()
    return complementarity_table(names, all_fail, solved)
