"""The comparison's leading figures, from the JSON files alone (``mutual-rl compare --from-summary``).

``delta_pass_at_1.png`` draws :func:`delta.delta_rows`: per policy and label, Δ pass@1 vs GRPO (percentage points)
and ± 2 standard errors of the difference over seeds — the table's 'Δ pass@1 vs GRPO' and 'beyond spread'. The
rows are checked against hand-derived values and against the table (a synthetic summary and the committed
results/graft_paper), and the figure's markers and bars against the rows. ``pass_at_1_curves.png``: one small
panel per regime, each against GRPO.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from mutual_rl.cli import main
from mutual_rl.compare import delta, plots, report
from mutual_rl.compare.labels import LABELS
from mutual_rl.compare.stats import beyond_spread, delta_se

RESULTS = Path(__file__).resolve().parents[2] / "results"
NAN = float("nan")


def _cell(values, seeds=None):
    return {"pass@1": {"values": values, "seeds": seeds or list(range(len(values))), "start": 0.35}}


#: written in an order other than the labels' (the figure's rows follow the labels' order)
SUMMARY = {
    "graft": {"gpt2": _cell([0.41, 0.43, 0.45]), "llama": _cell([0.30, 0.30, 0.33])},
    "grpo": {"gpt2": _cell([0.40, 0.40, 0.40]), "llama": _cell([0.30, 0.32, 0.34])},
    "sgt": {"gpt2": _cell([0.44])},  # one seed: no SE; no llama run: no llama row
    "hacpo": {"gpt2": _cell([0.39, NAN, 0.41], [0, 1, 2]), "llama": _cell([0.32, 0.32, 0.32])},
}
ORDER = [lab for lab in LABELS if lab in SUMMARY]  # grpo, sgt, hacpo, graft


def test_delta_rows_are_hand_derived_values_in_the_labels_order():
    rows = {(r.label, r.policy): r for r in delta.delta_rows(SUMMARY, ORDER)}
    assert [(r.label, r.policy) for r in delta.delta_rows(SUMMARY, ORDER)] == [
        ("sgt", "gpt2"), ("hacpo", "gpt2"), ("graft", "gpt2"), ("hacpo", "llama"), ("graft", "llama")]
    # graft, gpt2: mean 0.43 (sd 0.02) vs 0.40 (sd 0): Δ 3.0 pp, SE sqrt(0.02² / 3) = 1.1547 pp
    r = rows[("graft", "gpt2")]
    assert (r.mean, r.n, r.n_base) == (pytest.approx(3.0), 3, 3)
    assert (r.lo, r.hi) == (pytest.approx(3.0 - 2.309401), pytest.approx(3.0 + 2.309401))
    # graft, llama: 0.31 (sd 0.017321) vs 0.32 (sd 0.02): Δ -1.0 pp, SE sqrt((0.0003 + 0.0004) / 3) = 1.527525 pp
    r = rows[("graft", "llama")]
    assert (r.mean, r.lo, r.hi) == (pytest.approx(-1.0), pytest.approx(-1.0 - 3.055050),
                                    pytest.approx(-1.0 + 3.055050))
    # hacpo, gpt2: seed 1 has no value: 2 seeds (0.40, sd 0.014142) vs 0.40: Δ 0, SE 0.014142 / sqrt(2) = 1 pp
    r = rows[("hacpo", "gpt2")]
    assert (r.mean, r.lo, r.hi, r.n) == (pytest.approx(0.0, abs=1e-9), pytest.approx(-2.0), pytest.approx(2.0), 2)
    # sgt, gpt2: one seed: the point, no interval
    r = rows[("sgt", "gpt2")]
    assert r.mean == pytest.approx(4.0) and math.isnan(r.lo) and math.isnan(r.hi) and r.n == 1


def test_delta_rows_without_grpo_are_none():
    assert delta.delta_rows({k: v for k, v in SUMMARY.items() if k != "grpo"}, ORDER) == []


def test_the_se_counts_only_the_seeds_with_a_value():
    """[0.5, NaN, 0.7] are 2 seeds: SE = sd / sqrt(2) = 0.1, so Δ 0.19 is within 2 SE (counting the NaN as a
    third seed gave 2 SE = 0.163 and 'yes')."""
    delta, se = delta_se([0.5, NAN, 0.7], [0.41, 0.41])
    assert (delta, se) == (pytest.approx(0.19), pytest.approx(0.1))
    assert beyond_spread([0.5, NAN, 0.7], [0.41, 0.41]) == "no"
    assert beyond_spread([0.5, NAN], [0.41, 0.41]) == "n/a (1 seed)"


def _table_cells(lines: list[str], policies=("gpt2", "llama")) -> dict:
    """``(label, policy) -> (Δ cell, beyond-spread cell)`` of table.md's per-policy tables."""
    out, policy = {}, None
    for line in lines:
        if line.startswith("## "):
            policy = line[3:]
        elif line.startswith("| ") and not line.startswith(("| regime", "|---")) and policy in policies:
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[(cells[0], policy)] = (cells[-2], cells[-1])
    return out


def _check_rows_against_table(rows, cells):
    assert {(r.label, r.policy) for r in rows} == {k for k, v in cells.items() if v[0] != "—"}
    for r in rows:
        delta, spread = cells[(r.label, r.policy)]
        assert f"{r.mean:+.1f}" == delta, (r, delta)
        beyond = "n/a (1 seed)" if math.isnan(r.lo) else "yes" if r.lo > 0 or r.hi < 0 else "no"
        assert beyond == spread, (r, spread)


def test_delta_rows_are_the_tables_numbers():
    policies = ["gpt2", "llama"]
    body = report.table_body(ORDER, SUMMARY, policies, ["pass@1"], {})
    cells = _table_cells(body)
    assert cells[("graft", "gpt2")] == ("+3.0", "yes") and cells[("graft", "llama")] == ("-1.0", "no")
    assert cells[("sgt", "gpt2")] == ("+4.0", "n/a (1 seed)")
    _check_rows_against_table(delta.delta_rows(SUMMARY, ORDER), cells)


def test_delta_rows_are_the_committed_tables_numbers():
    root = RESULTS / "graft_paper"
    summary = json.loads((root / "summary.json").read_text())
    rows = delta.delta_rows(summary, [lab for lab in LABELS if lab in summary])
    cells = _table_cells((root / "table.md").read_text().split("\n"))
    assert len(rows) == 2 * (len(summary) - 1)
    assert cells[("graft_no_compat", "gpt2")] == ("+0.8", "yes")
    _check_rows_against_table(rows, cells)


@pytest.fixture
def saved(monkeypatch):
    """Every figure saved, by file name (its axes stay readable after pyplot closes it)."""
    matplotlib = pytest.importorskip("matplotlib")
    figures, save = {}, matplotlib.figure.Figure.savefig

    def record(fig, path, *args, **kwargs):
        figures[Path(path).name] = fig
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    return figures


def test_delta_figure_draws_the_rows(tmp_path, saved):
    delta.delta_plot(SimpleNamespace(regimes=ORDER, last_k=2), tmp_path, SUMMARY)
    assert (tmp_path / "delta_pass_at_1.png").stat().st_size > 0
    fig = saved["delta_pass_at_1.png"]
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title().split(":")[0] for ax in axes] == ["gpt2", "llama"]
    assert [t.get_text() for t in axes[0].get_yticklabels()] == ["sgt", "hacpo", "graft"]  # the labels' order
    assert axes[0].get_ylim()[0] > axes[0].get_ylim()[1]  # top to bottom
    for ax, policy in zip(axes, ["gpt2", "llama"]):
        rows = [r for r in delta.delta_rows(SUMMARY, ORDER) if r.policy == policy]
        y = {"sgt": 0, "hacpo": 1, "graft": 2}
        points = sorted((float(line.get_xdata()[0]), float(line.get_ydata()[0])) for line in ax.lines
                        if len(line.get_xdata()) == 1 and line.get_marker() not in (None, "None", "", "|"))
        assert points == sorted((r.mean, y[r.label]) for r in rows)
        bars = sorted((float(s[0][0]), float(s[1][0]), float(s[0][1])) for c in ax.collections
                      for s in c.get_segments())
        want = sorted((r.lo, r.hi, y[r.label]) for r in rows if not math.isnan(r.lo))
        assert len(bars) == len(want) and all(b == pytest.approx(w) for b, w in zip(bars, want))
        assert any(line.get_xdata()[0] == 0 and line.get_linestyle() == "-" for line in ax.lines
                   if len(line.get_xdata()) == 2)  # the vertical line at 0
    texts = [t.get_text() for t in axes[0].texts]
    assert "+3.0 ± 2.3" in texts and "+4.0 (no SE: 1 seed)  (1 v 3 seeds)" in texts
    assert "no llama pass@1" in [t.get_text() for t in axes[1].texts]  # sgt has no llama run


def _curves(summary) -> dict:
    """A curves.json: pass@1 at steps 0, 10, 20 per label, seed and policy (its final value the summary's)."""
    series: dict = {}
    for label, by_policy in summary.items():
        for p, cell in by_policy.items():
            for seed, v in zip(cell["pass@1"]["seeds"], cell["pass@1"]["values"]):
                pts = [[0, 0.35], [10, (0.35 + v) / 2], [20, v]] if v == v else [[0, 0.35]]
                series.setdefault(label, {}).setdefault(str(seed), {})[f"{p}/val/pass@1"] = pts
    return {"policies": ["gpt2", "llama"], "series": series}


def test_from_summary_writes_the_leading_figures(tmp_path, saved, capsys):
    out = tmp_path / "synthetic"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps(SUMMARY))
    (out / "curves.json").write_text(json.dumps(_curves(SUMMARY)))
    main(["compare", "--name", "synthetic", "--results", str(tmp_path), "--from-summary"])
    for name in ("delta_pass_at_1.png", "pass_at_1_curves.png", "pass_at_1_final.png"):
        assert (out / name).stat().st_size > 0, name
    assert not (out / "pass_at_1.png").exists()  # the all-in-one figure is gone: the small multiples replace it
    said = capsys.readouterr().out
    assert f"wrote {out / 'delta_pass_at_1.png'}, " in said and str(out / "pass_at_1_curves.png") in said

    # small multiples: per policy one panel per regime but GRPO, in the labels' order, each with GRPO's curve
    fig = saved["pass_at_1_curves.png"]
    for sub, policy in zip(fig.subfigs, ["gpt2", "llama"]):
        assert sub.get_suptitle() == f"{policy}: held-out pass@1, each regime against GRPO (grey, dashed)"
        panels = [ax for ax in sub.axes if ax.get_title()]
        assert [ax.get_title() for ax in panels] == ["sgt", "hacpo", "graft"]
        graft = panels[2]
        grey = [line for line in graft.lines if line.get_color() == plots.GREY]
        mine = [line for line in graft.lines if line.get_color() == LABELS["graft"].color]
        assert len(grey) == 1 and grey[0].get_linestyle() == "--" and len(mine) == 1
        base = [v for v in SUMMARY["grpo"][policy]["pass@1"]["values"]]
        assert grey[0].get_ydata()[-1] == pytest.approx(100 * sum(base) / len(base))
        own = SUMMARY["graft"][policy]["pass@1"]["values"]
        assert mine[0].get_ydata()[-1] == pytest.approx(100 * sum(own) / len(own))
    llama_sgt = [ax for ax in fig.subfigs[1].axes if ax.get_title() == "sgt"][0]
    assert [t.get_text() for t in llama_sgt.texts] == ["no held-out pass@1 logged"]


def test_every_committed_regime_gets_its_row_and_panel(tmp_path, saved):
    """results/graft_paper: each label but GRPO has its row (labels' order) and its small panel, per policy."""
    summary = json.loads((RESULTS / "graft_paper" / "summary.json").read_text())
    labels = [lab for lab in LABELS if lab in summary]
    delta.delta_plot(SimpleNamespace(regimes=labels, last_k=2), tmp_path, summary)
    data, policies = report.read_curves(RESULTS / "graft_paper")
    plots.curves_plot(plots.pyplot(), tmp_path, data, policies, labels, [0, 1, 2])
    others = [lab for lab in labels if lab != "grpo"]
    panels = [ax for ax in saved["delta_pass_at_1.png"].axes if ax.get_title()]
    assert [t.get_text() for t in panels[0].get_yticklabels()] == others
    assert re.match(r"gpt2: Δ vs GRPO \(grpo 43\.4 ± 0\.3 %, 3 seeds\)", panels[0].get_title())
    subfigs = saved["pass_at_1_curves.png"].subfigs
    assert len(subfigs) == len(policies) == 2
    for sub in subfigs:
        assert [ax.get_title() for ax in sub.axes if ax.get_title()] == others
