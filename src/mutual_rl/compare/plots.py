"""Figures of the regime comparison: readable, comparable across figures.

The leading figure, ``delta_pass_at_1.png``, is the table's 'Δ pass@1 vs GRPO' per policy with ± 2 standard errors
of the difference over seeds (:mod:`mutual_rl.compare.delta`); ``pass_at_1_curves.png`` shows each regime's held-out pass@1
curve in its own small panel against GRPO's. Every figure gives each regime one fixed colour
(:mod:`mutual_rl.compare.labels`), draws the mean over seeds as a line and mean ± 1 std over seeds as a band,
labels its axes with units and has a legend or says in its title what it draws; counts that span decades and KL
values use a log scale. ``data`` maps ``(regime label, seed)`` to ``{tag: [(step, value), ...]}``
(TensorBoard scalars of a run, or ``curves.json``); ``summary`` is ``summary.json``.

matplotlib is imported only here, when a figure is drawn: ``pip install "mutual-rl[plot]"``.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

from mutual_rl.compare import tags
from mutual_rl.compare.labels import color as _color
from mutual_rl.compare.labels import marker as _marker
from mutual_rl.compare.labels import style as _style
from mutual_rl.compare.stats import PLOT_EXTRA, mean_std

T = tags.PolicyTag
SMOOTH = 20  # steps of the moving average of per-step training metrics (entropy, KL)
BASE = "grpo"  # the reference of Δ, as the table's 'Δ pass@1 vs GRPO'


def pyplot():
    """matplotlib's pyplot on the Agg backend, or an ImportError naming the extra that installs it."""
    try:
        import matplotlib
    except ImportError as err:
        raise ImportError(f"the comparison's figures need matplotlib: {PLOT_EXTRA}") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _seed_curves(data, label, seeds, tag, smooth: int = 0, cumulative: bool = False):
    """``(steps, mean, std, n_seeds)`` of ``tag`` over the seeds of ``label`` at each step (numpy arrays).

    Each seed's series is first smoothed (trailing ``smooth``-step moving average, NaN steps skipped) or
    accumulated (``cumulative``); std is over seeds (0 where one seed has the step)."""
    import numpy as np

    per_seed = []
    for s in seeds:
        series = sorted(data.get((label, s), {}).get(tag, []))
        if not series:
            continue
        steps = np.array([st for st, _ in series], dtype=float)
        ys = np.array([v for _, v in series], dtype=float)
        if cumulative:
            ys = np.cumsum(np.nan_to_num(ys))
        elif smooth > 1:
            ok = ~np.isnan(ys)
            csum, cnt = np.cumsum(np.where(ok, ys, 0.0)), np.cumsum(ok)
            lo = np.maximum(np.arange(len(ys)) - smooth, -1)
            tot = csum - np.where(lo >= 0, csum[np.maximum(lo, 0)], 0.0)
            num = cnt - np.where(lo >= 0, cnt[np.maximum(lo, 0)], 0)
            ys = np.where(num > 0, tot / np.maximum(num, 1), np.nan)
        per_seed.append(dict(zip(steps.tolist(), ys.tolist())))
    if not per_seed:
        return None
    steps = sorted(set().union(*per_seed))
    table = np.array([[d.get(st, np.nan) for st in steps] for d in per_seed])  # [seeds, steps]
    n = (~np.isnan(table)).sum(0)
    with warnings.catch_warnings():  # a step no seed has (all NaN), or one seed only: no spread
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(table, 0)
        std = np.nanstd(table, 0, ddof=1) if len(per_seed) > 1 else np.zeros(len(steps))
    keep = n > 0
    return np.array(steps)[keep], mean[keep], np.nan_to_num(np.where(n > 1, std, 0.0))[keep], n[keep]


def _band(ax, curve, label, *, log: bool = False, marker: str | None = None, linewidth: float = 1.6,
          color: str | None = None, linestyle: str | None = None, alpha: float = 0.18):
    """The seed mean as a line and mean ± std as a shaded band (clipped at the lower edge on a log axis); the
    label's colour and line style unless given."""
    import numpy as np

    steps, mean, std, _ = curve
    lo, hi = mean - std, mean + std
    if log:
        keep = mean > 0
        steps, mean, lo, hi = steps[keep], mean[keep], lo[keep], hi[keep]
        if not len(steps):
            return
        lo = np.maximum(lo, mean.min() / 10)
    color = color or _color(label)
    ax.plot(steps, mean, color=color, linestyle=linestyle or _style(label), marker=marker, markersize=4,
            linewidth=linewidth, label=label)
    ax.fill_between(steps, lo, hi, color=color, alpha=alpha, linewidth=0)


def _legend(fig, labels, ncol=None, title="regime (line: mean over seeds; band: ± 1 std over seeds)",
            markers: bool = False) -> float:
    """A legend below the panels; returns the figure fraction it takes (the ``rect`` bottom for tight_layout)."""
    pyplot()
    import matplotlib.lines as mlines

    ncol = max(1, min(ncol or len(labels), 6, len(labels) or 1))
    handles = [mlines.Line2D([], [], color=_color(lab), linestyle="none" if markers else _style(lab),
                             marker=_marker(lab) if markers else None, linewidth=2, label=lab)
               for lab in labels]
    fig.legend(handles=handles, loc="lower center", ncol=ncol, frameon=False, fontsize=9, title=title,
               title_fontsize=9)
    rows = math.ceil(len(labels) / ncol) if labels else 0
    return min(0.45, (0.45 + 0.24 * rows) / fig.get_figheight())


def _kl_tag(data, label, seeds, p) -> str:
    """``self/approx_kl`` (own rows: comparable across regimes) when the runs logged it, else ``approx_kl``."""
    own = tags.policy(p, T.SELF_APPROX_KL)
    has = any(data.get((label, s), {}).get(own) for s in seeds)
    return own if has else tags.policy(p, T.APPROX_KL)


def _seed_note(seeds) -> str:
    return f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''}"


def plots(args, root: Path, data, policies) -> None:
    """``pass_at_1_curves.png``, ``entropy_kl.png`` and ``transfers.png`` from per-step scalars (runs or
    curves.json)."""
    plt = pyplot()

    regimes, seeds = list(args.regimes), list(args.seeds)
    note = _seed_note(seeds)

    curves_plot(plt, root, data, policies, regimes, seeds)

    fig, axes = plt.subplots(2, len(policies), figsize=(6.5 * len(policies), 8), squeeze=False)
    for j, p in enumerate(policies):
        kl_own = True
        for label in regimes:
            c = _seed_curves(data, label, seeds, tags.policy(p, T.ENTROPY), smooth=SMOOTH)
            if c is not None:
                _band(axes[0][j], c, label)
            tag = _kl_tag(data, label, seeds, p)
            kl_own &= tag.endswith(T.SELF_APPROX_KL)
            c = _seed_curves(data, label, seeds, tag, smooth=SMOOTH)
            if c is not None:
                _band(axes[1][j], c, label, log=True)
        axes[0][j].set(title=f"{p}: token entropy ({SMOOTH}-step moving average, {note})", xlabel="training step",
                       ylabel="entropy (nats / token)")
        kl_what = "own rows" if kl_own else "all rows; PRP peer_aligned: peer rows vs the peer trace"
        axes[1][j].set(title=f"{p}: approx. KL to the behaviour policy ({kl_what})", xlabel="training step",
                       ylabel="approx. KL, k3 (nats / token, log scale)", yscale="log")
        for ax in axes[:, j]:
            ax.grid(alpha=0.3, which="both")
    bottom = _legend(fig, regimes)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(root / "entropy_kl.png", dpi=110)
    plt.close(fig)

    flows = sorted({f for s in data.values() for f in map(tags.consumed_flow, s) if f is not None})
    sharing = [lab for lab in regimes if any(data.get((lab, s), {}).get(tags.exchange(f, tags.CONSUMED))
                                             for s in seeds for f in flows)]
    fig, axes = plt.subplots(1, max(1, len(flows)), figsize=(6.5 * max(1, len(flows)), 4.6), squeeze=False)
    for ax, flow in zip(axes[0], flows):
        for k, label in enumerate(sharing):  # earlier regimes drawn wider: equal counts show as nested stripes
            c = _seed_curves(data, label, seeds, tags.exchange(flow, tags.CONSUMED), cumulative=True)
            if c is not None:
                _band(ax, c, label, log=True, linewidth=1.4 + 1.1 * (len(sharing) - 1 - k))
        ax.set(title=f"{flow}: peer responses consumed, cumulative ({note}; log scale)", xlabel="training step",
               ylabel="peer responses consumed (count)", yscale="log")
        if not ax.lines:
            ax.text(0.5, 0.5, "no peer response consumed", ha="center", va="center", transform=ax.transAxes)
        ax.grid(alpha=0.3, which="both")
    if not flows:
        axes[0][0].set_axis_off()
        axes[0][0].text(0.5, 0.5, "no exchange flows logged", ha="center", va="center")
    bottom = _legend(fig, sharing or regimes)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(root / "transfers.png", dpi=110)
    plt.close(fig)


GREY = "#808080"  # GRPO, the reference, in the small multiples


def _grid(n: int, ncols: int = 4) -> tuple[int, int]:
    """Rows and columns of a grid of ``n`` small panels (at most ``ncols`` wide)."""
    cols = max(1, min(ncols, n))
    return max(1, math.ceil(n / cols)), cols


def curves_plot(plt, root: Path, data, policies, regimes, seeds, base: str = BASE) -> None:
    """``pass_at_1_curves.png``: small multiples, one grid per policy (side by side) and in it one panel per regime
    (the labels' order): the regime's held-out pass@1 at each evaluation (its colour, solid: mean over seeds; band:
    ± 1 std over seeds) against ``base``'s (GRPO: grey, dashed, same statistics); the panels of a policy share
    their axes. Without ``base`` runs each panel shows the regime alone and the policy's title says so."""
    others = [lab for lab in regimes if lab != base] or list(regimes)
    rows, cols = _grid(len(others))
    fig = plt.figure(figsize=(2.6 * cols * len(policies) + 0.4, 2.1 * rows + 1.5), layout="constrained")
    subfigs = fig.subfigures(1, len(policies), squeeze=False, wspace=0.04)[0]
    tag_of = {p: tags.policy(p, T.VAL_PASS1) for p in policies}
    pct = lambda c: (c[0], 100 * c[1], 100 * c[2], c[3])  # noqa: E731
    for sub, p in zip(subfigs, policies):
        ref = _seed_curves(data, base, seeds, tag_of[p])
        axes = sub.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)
        for k, ax in enumerate(axes.flat):
            if k >= len(others):
                ax.set_axis_off()
                continue
            label = others[k]
            if ref is not None and label != base:
                _band(ax, pct(ref), base, color=GREY, linestyle="--", linewidth=1.3, alpha=0.15)
            c = _seed_curves(data, label, seeds, tag_of[p])
            if c is not None:
                _band(ax, pct(c), label, marker="o", linestyle="-")
            else:
                ax.text(0.5, 0.5, "no held-out pass@1 logged", ha="center", va="center", fontsize=8,
                        transform=ax.transAxes)
            ax.set_title(label, fontsize=9, color="black", pad=3)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            if k % cols == 0:
                ax.set_ylabel("pass@1 (%)", fontsize=8)
            if k + cols >= len(others):
                ax.set_xlabel("training step", fontsize=8)
                ax.xaxis.set_tick_params(labelbottom=True)
        against = f"each regime against {base.upper()} (grey, dashed)" if ref is not None else \
            f"no {base} runs: each regime alone"
        sub.suptitle(f"{p}: held-out pass@1, {against}", fontsize=11)
    fig.suptitle(f"held-out pass@1 at each evaluation; line: mean over seeds, band: ± 1 std over seeds "
                 f"({_seed_note(seeds)})", fontsize=10)
    fig.savefig(root / "pass_at_1_curves.png", dpi=110)
    plt.close(fig)


def final_plot(args, root: Path, summary: dict) -> None:
    """``pass_at_1_final.png`` from ``summary.json``: per policy and metric (overall, per skill) each regime's
    end-of-run pass@1 (mean of the last evaluations) per seed (dots) and mean ± std over seeds (marker and bar);
    the dashed segment is the step-0 value (before RL)."""
    plt = pyplot()

    regimes = [lab for lab in args.regimes if lab in summary] + [lab for lab in summary if lab not in args.regimes]
    policies = sorted({p for lab in regimes for p in summary[lab]})
    metrics = sorted({m for lab in regimes for p in summary[lab] for m in summary[lab][p]},
                     key=lambda m: (m != "pass@1", m))
    n_seeds = max((len(v["values"]) for lab in regimes for p in summary[lab] for v in summary[lab][p].values()),
                  default=0)
    fig, axes = plt.subplots(1, len(policies), figsize=(6.5 * len(policies), 4.8), squeeze=False)
    width = 0.8 / max(len(regimes), 1)
    for ax, p in zip(axes[0], policies):
        for i, m in enumerate(metrics):
            starts = [summary[lab][p][m]["start"] for lab in regimes if m in summary[lab].get(p, {})]
            start = next((x for x in starts if x == x), None)
            if start is not None:
                ax.hlines(100 * start, i - 0.45, i + 0.45, colors="#808080", linestyles=":", linewidth=1.5,
                          label="step 0 (before RL)" if i == 0 else None)
            for j, lab in enumerate(regimes):
                cell = summary[lab].get(p, {}).get(m)
                if not cell:
                    continue
                xs = i - 0.4 + width * (j + 0.5)
                vals = [100 * v for v in cell["values"] if v == v]
                mu, sd = mean_std(vals)
                ax.scatter([xs] * len(vals), vals, s=10, color=_color(lab), alpha=0.45, linewidths=0)
                ax.errorbar([xs], [mu], yerr=[sd], fmt="o", color=_color(lab), markersize=5, capsize=3,
                            label=lab if i == 0 else None)
        ax.set_xticks(range(len(metrics)), [m.replace("pass@1/", "skill: ") if m != "pass@1" else "overall"
                                            for m in metrics])
        ax.set_xlim(-0.5, len(metrics) - 0.5)
        ax.set(title=f"{p}: held-out pass@1 at the end ({n_seeds} seeds)", xlabel="held-out split",
               ylabel=f"held-out pass@1 (%; mean of the last {args.last_k} evaluations)")
        ax.grid(alpha=0.3, axis="y")
    handles, labels = axes[0][0].get_legend_handles_labels()
    ncol = min(len(labels), 6) or 1
    fig.legend(handles, labels, loc="lower center", ncol=ncol, frameon=False, fontsize=9,
               title="regime (marker and bar: mean ± 1 std over seeds; dots: seeds)", title_fontsize=9)
    fig.tight_layout(rect=(0, min(0.45, (0.45 + 0.24 * math.ceil(len(labels) / ncol)) / fig.get_figheight()), 1, 1))
    fig.savefig(root / "pass_at_1_final.png", dpi=110)
    plt.close(fig)


def _directions(data, policies) -> list[tuple[str, str]]:
    """``(receiver, peer)`` pairs with a rescue series ``<R>/rescued/<S>`` or a complementarity ``R->S``."""
    out = set()
    for sc in data.values():
        for t in sc:
            parts = t.split("/")
            direction = tags.direction_of(t)
            if len(parts) == 3 and parts[0] in policies and parts[1] == T.RESCUED:
                out.add((parts[0], parts[2]))
            elif direction is not None and "->" in direction:
                out.add(tuple(direction.split("->", 1)))
    return sorted(out)


def rescue_plot(args, root: Path, data, policies) -> None:
    """``rescue_complementarity.png``: per direction (receiver R, peer S), R's all-fail prompts rescued by S per
    training step (``<R>/rescued/<S>``: GRAFT's grafted groups, SGT's rescued prompts; a moving average) and the
    held-out complementarity ``R->S`` (share of R's all-fail prompts S solves) at each evaluation."""
    plt = pyplot()

    regimes, seeds = list(args.regimes), list(args.seeds)
    dirs = _directions(data, policies) or [("", "")]
    fig, axes = plt.subplots(2, len(dirs), figsize=(6.5 * len(dirs), 8), squeeze=False)
    shown: list[str] = []
    for j, (r, s) in enumerate(dirs):
        for label in regimes:
            c = _seed_curves(data, label, seeds, tags.rescued(r, s), smooth=SMOOTH)
            if c is not None:
                _band(axes[0][j], c, label)
                shown.append(label)
            c = _seed_curves(data, label, seeds, tags.complementarity(f"{r}->{s}"))
            if c is not None:
                _band(axes[1][j], (c[0], 100 * c[1], 100 * c[2], c[3]), label, marker="o")
                shown.append(label)
        axes[0][j].set_title(f"{r}'s all-fail prompts rescued by {s}\n(per step, {SMOOTH}-step moving average, "
                             f"{_seed_note(seeds)})", fontsize=10)
        axes[0][j].set(xlabel="training step", ylabel="rescued prompts per step")
        axes[1][j].set_title(f"held-out complementarity {r}->{s}\n(share of {r}'s all-fail prompts {s} solves, "
                             "at each evaluation)", fontsize=10)
        axes[1][j].set(xlabel="training step", ylabel="complementarity (% of all-fail prompts)")
        for ax, what in ((axes[0][j], "no rescue metric logged"), (axes[1][j], "no complementarity logged")):
            if not ax.lines:
                ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes)
            ax.grid(alpha=0.3)
    labels = [lab for lab in regimes if lab in shown] or regimes
    bottom = _legend(fig, labels)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(root / "rescue_complementarity.png", dpi=110)
    plt.close(fig)


def score_compute_points(summary: dict, compute: dict, label: str, policy: str | None,
                         x_key: str = "generated_tokens"):
    """Per seed ``(x, y)`` of ``label``: the final pass@1 of ``policy`` against its ``x_key`` (``policy=None``:
    the mean pass@1 over the policies against their sum), seeds matched by ``summary``'s ``seeds``."""
    seeds = compute.get(label, {}).get("seeds", {})
    rows = summary.get(label, {})
    pols = [policy] if policy else sorted(rows)
    by_seed: dict = {}
    for p in pols:
        cell = rows.get(p, {}).get("pass@1")
        if not cell:
            continue
        for s, v in zip(cell.get("seeds", range(len(cell["values"]))), cell["values"]):
            by_seed.setdefault(str(s), {})[p] = v
    pts = []
    for s, ys in sorted(by_seed.items()):
        pc = seeds.get(s, {}).get("policies", {})
        if len(ys) < len(pols) or not all(p in pc for p in pols):
            continue
        pts.append((sum(pc[p][x_key] for p in pols), sum(ys.values()) / len(ys)))
    return pts


def score_compute_plot(args, root: Path, summary: dict, compute: dict) -> None:
    """``score_vs_compute.png`` (GRAFT Fig. 3a): per policy, and for the policies together, the end-of-run
    held-out pass@1 (mean ± std over seeds) against the generated response tokens (mean ± std over seeds; the
    policy's own, or their sum), one colour and marker per regime; log x axis when the values span a decade."""
    plt = pyplot()

    regimes = [lab for lab in args.regimes if lab in summary and lab in compute]
    policies = sorted({p for lab in regimes for p in summary[lab]})
    panels = policies + [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 4.8), squeeze=False)
    for ax, p in zip(axes[0], panels):
        xs_all = []
        for lab in regimes:
            pts = score_compute_points(summary, compute, lab, p)
            if not pts:
                continue
            (mx, sx), (my, sy) = mean_std([x for x, _ in pts]), mean_std([100 * y for _, y in pts])
            xs_all.append(mx)
            ax.errorbar([mx], [my], xerr=[sx], yerr=[sy], fmt=_marker(lab), color=_color(lab),
                        markersize=7, capsize=3, label=lab)
        pos = [x for x in xs_all if x > 0]
        if pos and max(pos) >= 10 * min(pos):
            ax.set_xscale("log")
        who = f"{p}: final pass@1 vs its generated tokens" if p else \
            "all policies: mean final pass@1 vs summed tokens"
        ax.set_title(who, fontsize=10)
        ax.set(ylabel=f"held-out pass@1 (%; mean of the last {args.last_k} evaluations)",
               xlabel="generated response tokens (whole run" + (", log scale)" if ax.get_xscale() == "log" else ")"))
        if not ax.lines and not ax.collections:
            ax.text(0.5, 0.5, "no finished run with compute", ha="center", va="center", transform=ax.transAxes)
        ax.grid(alpha=0.3, which="both")
    shown = [lab for lab in regimes if any(score_compute_points(summary, compute, lab, p) for p in panels)]
    n_seeds = max((len(s.get("seeds", {})) for s in compute.values()), default=0)
    bottom = _legend(fig, shown or regimes, markers=True,
                     title=f"regime (marker: mean over {n_seeds} seed(s); bars: ± 1 std over seeds)")
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(root / "score_vs_compute.png", dpi=110)
    plt.close(fig)
