"""The papers' orderings of the regimes, checked against a comparison: the table's section "The papers' orderings".

Each :class:`Claim` is one ordering a paper states between two labels of the driver (``a`` above ``b``, ``a`` at
least ``b``, or the two alike), with where it is said. :func:`claim_rows` checks every claim whose two labels were
run, per policy, on the final held-out pass@1 over seeds, with the table's statistics: Δ = mean(a) − mean(b) and
the Welch standard error of the difference (:func:`mutual_rl.compare.stats.delta_se`); 'beyond spread' is
|Δ| > 2 SE, as in the policy tables. Verdicts (:func:`verdict`):

* ``>``: *holds* when Δ > 2 SE, *reversed* when Δ < −2 SE, else *not resolved* (this comparison cannot tell);
* ``>=``: *holds* when Δ > 2 SE, *fails* when Δ < −2 SE (a shortfall beyond spread), else *consistent*;
* ``~``: *fails* when |Δ| > 2 SE, else *consistent*;
* *n/a* with fewer than two seeds on either side.

*Consistent* is not *holds*: it says no difference exceeds the spread, which at a wide spread says little (the
row's ± 2 SE shows how little).

The papers trained 1.5-3 B models on mathematical reasoning benchmarks; this benchmark is two sub-million parameter
policies on 2-digit arithmetic. A verdict says what this benchmark shows, not whether the paper is right.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from mutual_rl.compare.stats import delta_se

#: the two papers, as docs/methods.md names them
SOURCES = {"GRAFT": "GRAFT = 'Learning Beyond What You Sample', arXiv 2609.37868",
           "Mutual RL": "Mutual RL = 'Experience Sharing in Mutual Reinforcement Learning for Heterogeneous Language "
                        "Models', arXiv 2605.07244"}


class Claim(NamedTuple):
    """``a relation b`` (``>``, ``>=`` or ``~``) on final held-out pass@1, as ``source`` (``where``) says it."""

    a: str
    relation: str
    b: str
    source: str
    where: str
    says: str


#: the orderings the two papers state between regimes this driver runs, in the papers' words (abridged). Some are
#: majority results over the papers' model pairs ("in two of three pairs", "in five of six blocks"): ``says`` keeps
#: the qualifier. Not listed, because the papers state no pass@1 ordering for them: larger rollout budgets vs GRPO,
#: the GRAFT ablations (their §6.3 results), DAPO dynamic sampling, F-TIS, and PRP's two denominators (THL's
#: correction "mitigates some issues" of stability). The Mutual RL rows are from its experiments as summarised.
CLAIMS: tuple[Claim, ...] = (
    Claim("graft", ">", "grpo", "GRAFT", "abstract, introduction, Table 1",
          "improves both models in every pair over GRPO"),
    Claim("graft", ">=", "grpo_n32", "GRAFT", "introduction, Table 1",
          "in two of three pairs both models match or exceed GRPO with four times the rollout budget"),
    Claim("graft", ">", "hacpo", "GRAFT", "introduction", "outperforms HACPO by 4.0 points on average"),
    Claim("graft", ">", "sgt", "GRAFT", "introduction", "outperforms SGT by 1.5 points on average"),
    Claim("grpo", ">", "hacpo", "GRAFT", "Table 1", "HACPO falls below budget-matched GRPO in five of six blocks"),
    Claim("sgt", ">", "hacpo", "GRAFT", "introduction, Table 1",
          "SGT does better than HACPO (GRAFT leads them by 1.5 and 4.0 points on average)"),
    Claim("graft_stored", ">", "grpo", "GRAFT", "abstract, introduction",
          "stored peer trajectories improve over GRPO by 1.8 points on average"),
    Claim("graft", ">=", "graft_stored", "GRAFT", "abstract, introduction", "stored peers preserve most of the gains"),
    Claim("graft", ">", "graft_hacpo_rule", "GRAFT", "introduction, Section 6.3",
          "HACPO's update rule on GRAFT's selected prompts still underperforms GRAFT"),
    Claim("graft", ">", "graft_sgt_rule", "GRAFT", "introduction, Section 6.3",
          "SGT's update rule on GRAFT's selected prompts still underperforms GRAFT"),
    Claim("sgt", ">", "grpo", "Mutual RL", "results", "SGT: the strongest average performance, at or above GRPO"),
    Claim("sgt", ">", "xgrpo", "Mutual RL", "results",
          "outcome-level sharing (SGT) is the superior abstraction; XGRPO tracks GRPO"),
    Claim("sgt", ">", "prp_snapshot", "Mutual RL", "results", "PRP reduces average accuracy compared to SGT"),
    Claim("sgt", ">", "prp_aligned", "Mutual RL", "results", "PRP reduces average accuracy compared to SGT"),
    Claim("xgrpo", "~", "grpo", "Mutual RL", "results", "XGRPO tracks closely with standalone GRPO"),
)


class ClaimRow(NamedTuple):
    """One claim for one policy: Δ = mean(a) − mean(b) and its standard error, in percentage points."""

    claim: Claim
    policy: str
    delta: float
    se: float
    verdict: str


def verdict(relation: str, delta: float, se: float) -> str:
    """The verdict on ``a relation b`` from Δ and its standard error (see the module's docstring)."""
    if math.isnan(delta) or math.isnan(se):
        return "n/a (1 seed)"
    if relation == ">":
        return "holds" if delta > 2 * se else "reversed" if delta < -2 * se else "not resolved"
    if relation == ">=":
        return "holds" if delta > 2 * se else "fails" if delta < -2 * se else "consistent"
    if relation == "~":
        return "fails" if abs(delta) > 2 * se else "consistent"
    raise ValueError(f"unknown relation {relation!r}: one of '>', '>=', '~'")


def claim_rows(summary: dict, claims=CLAIMS) -> list[ClaimRow]:
    """Every claim whose two labels both have a final pass@1 for a policy (sorted), in ``claims``' order."""
    rows = []
    for claim in claims:
        for p in sorted({p for lab in summary for p in summary[lab]}):
            a = summary.get(claim.a, {}).get(p, {}).get("pass@1", {}).get("values")
            b = summary.get(claim.b, {}).get(p, {}).get("pass@1", {}).get("values")
            if not a or not b:
                continue
            d, se = delta_se(a, b)
            rows.append(ClaimRow(claim, p, 100 * d, 100 * se, verdict(claim.relation, d, se)))
    return rows


def claim_lines(summary: dict, claims=CLAIMS) -> list[str]:
    """The table's section: one row per claim and policy (none when no claim has both labels run)."""
    rows = claim_rows(summary, claims)
    if not rows:
        return []
    lines = ["## The papers' orderings", "",
             "Each ordering a paper states between two regimes of this comparison, per policy, on the final held-out "
             "pass@1: Δ = a − b (mean over seeds, percentage points) ± 2 SE of the difference (Welch). `>` holds "
             "when Δ > 2 SE, is reversed when Δ < −2 SE and is otherwise not resolved; `>=` holds when Δ > 2 SE, "
             "fails when Δ < −2 SE and is otherwise consistent; `~` fails when |Δ| > 2 SE and is otherwise "
             "consistent. Consistent means no difference beyond spread, which says little where ± 2 SE is wide. Some "
             "orderings are majority results over the papers' model pairs (the qualifier is kept in their words). "
             "The papers trained 1.5-3 B "
             "models on mathematical reasoning benchmarks; a verdict says what this benchmark shows. Sources: "
             + "; ".join(SOURCES[k] for k in dict.fromkeys(r.claim.source for r in rows)) + ".", "",
             "| a | relation | b | policy | Δ ± 2 SE | verdict | source | the paper says |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r.claim
        interval = f"{r.delta:+.1f}" if math.isnan(r.se) else f"{r.delta:+.1f} ± {2 * r.se:.1f}"
        lines.append(f"| {c.a} | `{c.relation}` | {c.b} | {r.policy} | {interval} | {r.verdict} | "
                     f"{c.source} {c.where} | {c.says} |")
    counts = {v: sum(r.verdict == v for r in rows) for v in dict.fromkeys(r.verdict for r in rows)}
    return lines + ["", "Verdicts: " + ", ".join(f"{k} {n}" for k, n in counts.items()) + ".", ""]
