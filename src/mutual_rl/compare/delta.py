"""``delta_pass_at_1.png``, the comparison's leading figure: per policy, each regime's Δ held-out pass@1 vs GRPO with
± 2 standard errors of the difference over seeds -- the rows and numbers of the table's 'Δ pass@1 vs GRPO'
(:func:`delta_rows`, from :func:`mutual_rl.compare.stats.delta_se`). matplotlib is imported when it is drawn."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from mutual_rl.compare.labels import color as _color
from mutual_rl.compare.labels import marker as _marker
from mutual_rl.compare.plots import BASE, GREY, _seed_note, pyplot
from mutual_rl.compare.stats import delta_se, mean_std


class DeltaRow(NamedTuple):
    """One row of ``delta_pass_at_1.png``: ``label``'s final held-out pass@1 minus GRPO's for ``policy`` in
    percentage points (``mean``, mean over seeds minus GRPO's mean over seeds, the table's Δ) and its interval
    ``lo`` .. ``hi`` = mean ∓ 2 standard errors of the difference over seeds (Welch, as the table's 'beyond
    spread'; NaN with fewer than 2 seeds on either side); ``n`` / ``n_base``: the seeds of each side."""

    label: str
    policy: str
    mean: float
    lo: float
    hi: float
    n: int
    n_base: int


def delta_rows(summary: dict, labels, base: str = BASE) -> list[DeltaRow]:
    """The rows ``delta_pass_at_1.png`` draws, from ``summary.json``: per policy (sorted), every label of
    ``labels`` but ``base`` (in that order) with a final pass@1, against ``base``'s pass@1 of that policy —
    the same rows and numbers as the table's 'Δ pass@1 vs GRPO' (:func:`mutual_rl.compare.stats.delta_se`).
    A policy without ``base`` rows has none (the table shows '—')."""
    rows = []
    for p in sorted({p for lab in summary for p in summary[lab]}):
        ref = summary.get(base, {}).get(p, {}).get("pass@1", {}).get("values", [])
        if not ref:
            continue
        for label in labels:
            vals = summary.get(label, {}).get(p, {}).get("pass@1", {}).get("values")
            if label == base or not vals:
                continue
            d, se = delta_se(vals, ref)
            rows.append(DeltaRow(label, p, 100 * d, 100 * (d - 2 * se), 100 * (d + 2 * se),
                                 sum(v == v for v in vals), sum(v == v for v in ref)))
    return rows


def _delta_panel(ax, p: str, rows, shown: list[str], ys: dict, common, summary: dict, base: str) -> None:
    """One policy's panel of :func:`delta_plot`: its rows' Δ ± 2 SE, the values at the right, title and axes."""
    mine = [r for r in rows if r.policy == p]
    ax.axvline(0, color="black", linewidth=1)
    for r in mine:
        y, color, has_se = ys[r.label], _color(r.label), r.lo == r.lo
        filled = has_se and (r.lo > 0 or r.hi < 0)
        xerr = [[r.mean - r.lo], [r.hi - r.mean]] if has_se else None
        ax.errorbar([r.mean], [y], xerr=xerr, fmt=_marker(r.label), color=color, markersize=7,
                    markerfacecolor=color if filled else "white", markeredgewidth=1.4, capsize=3, elinewidth=2)
        text = f"{r.mean:+.1f} ± {(r.hi - r.mean):.1f}" if has_se else f"{r.mean:+.1f} (no SE: 1 seed)"
        if (r.n, r.n_base) != common:
            text += f"  ({r.n} v {r.n_base} seeds)"
        ax.text(1.02, y, text, transform=ax.get_yaxis_transform(), va="center", fontsize=8,
                fontweight="bold" if filled else "normal")
    for lab in shown:
        if not any(r.label == lab for r in mine):
            ax.text(1.02, ys[lab], f"no {p} pass@1", transform=ax.get_yaxis_transform(), va="center", fontsize=8,
                    color=GREY)
    ref = summary.get(base, {}).get(p, {}).get("pass@1", {}).get("values", [])
    if ref:
        mu, sd = mean_std([100 * v for v in ref])
        title = f"{p}: Δ vs GRPO ({base} {mu:.1f} ± {sd:.1f} %, {_seed_note([v for v in ref if v == v])})"
    else:
        title = f"{p}: no {base} pass@1 — Δ vs GRPO needs the {base} runs"
        ax.text(0.5, 0.5, f"no {base} runs for {p}", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("Δ held-out pass@1 vs GRPO (percentage points)\nmarker: mean over seeds; bar: ± 2 SE of "
                  "the difference over seeds (Welch)", fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    ax.set_axisbelow(True)
    lo = min([r.lo for r in mine if r.lo == r.lo] + [r.mean for r in mine] + [0.0])
    hi = max([r.hi for r in mine if r.hi == r.hi] + [r.mean for r in mine] + [0.0])
    pad = 0.08 * (hi - lo) or 1.0
    ax.set_xlim(lo - pad, hi + pad)


def delta_plot(args, root: Path, summary: dict, base: str = BASE) -> None:
    """``delta_pass_at_1.png``, the leading figure: per policy one panel, one row per label (the labels' order,
    top to bottom), a marker at Δ pass@1 vs GRPO and a bar of ± 2 SE of the difference over seeds
    (:func:`delta_rows`); filled where |Δ| > 2 SE (the table's 'beyond spread'), hollow where not; no bar with
    one seed; the value printed at the right of each row."""
    plt = pyplot()

    labels = [lab for lab in args.regimes if lab in summary] + [lab for lab in summary if lab not in args.regimes]
    policies = sorted({p for lab in summary for p in summary[lab]}) or ["(no policy)"]
    rows = delta_rows(summary, labels, base)
    shown = [lab for lab in labels if any(r.label == lab for r in rows)]
    ys = {lab: i for i, lab in enumerate(shown)}
    counts = [(r.n, r.n_base) for r in rows]
    common = max(set(counts), key=lambda c: (counts.count(c), c)) if counts else None  # seeds: most rows' pair
    fig, axes = plt.subplots(1, len(policies), figsize=(5.6 * len(policies) + 1.6, 0.32 * len(shown) + 2.4),
                             sharey=True, squeeze=False)
    for ax, p in zip(axes[0], policies):
        _delta_panel(ax, p, rows, shown, ys, common, summary, base)
    ax0 = axes[0][0]
    ax0.set_yticks(range(len(shown)), shown, fontsize=9)
    ax0.set_ylim(len(shown) - 0.5, -0.5)  # the labels' order top to bottom
    if not shown:
        ax0.set_yticks([])
    marks = [plt.Line2D([], [], color="black", marker="o", linestyle="none", markerfacecolor=f, label=what)
             for f, what in (("black", "|Δ| > 2 SE (the table's 'beyond spread': yes)"),
                             ("white", "|Δ| ≤ 2 SE"))]
    n_note = "no Δ to draw" if common is None else \
        f"seeds: {common[0]} per label, {common[1]} for GRPO" + ("" if len(set(counts)) == 1 else
                                                               " (other counts: at the right, label v GRPO)")
    fig.legend(handles=marks, loc="lower center", ncol=2, frameon=False, fontsize=8,
               title=f"final pass@1 = mean of the last {args.last_k} evaluations of a run; {n_note}; "
                     "rows in the labels' order (mutual-rl compare --list)", title_fontsize=8)
    fig.suptitle("Δ held-out pass@1 vs GRPO at the end of training, per policy (at the right: Δ ± 2 SE, in "
                 "percentage points)", fontsize=11)
    fig.tight_layout(rect=(0, min(0.3, 0.6 / fig.get_figheight()), 1, 1))
    fig.savefig(root / "delta_pass_at_1.png", dpi=110)
    plt.close(fig)


