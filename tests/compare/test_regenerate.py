"""The committed reports regenerate unchanged without their run folders (which are not committed).

The comparisons' ``table.md`` from their summary.json and compute.json (the lines above the first policy table —
title, commit and command of the runs' report, the settings, the step-0 diagnostics — are not in the JSON and are
kept); the JSON writers reproduce the committed JSON byte for byte; ``results/real/*/report.md`` from
``report.json``. Figures are drawn by the smoke tests; here they are left out (``replot`` recorded, not run).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mutual_rl.cli import main
from mutual_rl.compare import report

RESULTS = Path(__file__).resolve().parents[2] / "results"


@pytest.fixture
def no_figures(monkeypatch):
    calls = []
    monkeypatch.setattr(report, "replot", lambda s, root, order: calls.append(root))
    return calls


def _copy(name: str, dest: Path, files=("summary.json", "compute.json", "curves.json", "table.md")) -> Path:
    out = dest / name
    out.mkdir(parents=True)
    for f in files:
        if (RESULTS / name / f).exists():
            shutil.copy(RESULTS / name / f, out / f)
    return out


@pytest.mark.parametrize("name", ["v3", "v4", "graft_paper"])
def test_comparison_table_regenerates_byte_for_byte(name, tmp_path, no_figures, capsys):
    out = _copy(name, tmp_path)
    (out / "table.md").write_text((RESULTS / name / "table.md").read_text().split("\n## gpt2\n")[0]
                                  + "\n## gpt2\n(stale rows, rebuilt below)\n")
    main(["compare", "--name", name, "--results", str(tmp_path), "--report-only"])
    assert (out / "table.md").read_bytes() == (RESULTS / name / "table.md").read_bytes()
    assert no_figures == [out]
    said = capsys.readouterr().out
    assert "rebuilt" in said and "diagnostics.md kept as it is" in said
    for f in ("summary.json", "compute.json", "curves.json"):  # inputs, untouched
        assert (out / f).read_bytes() == (RESULTS / name / f).read_bytes()


def test_graft_paper_tables_without_an_earlier_table(tmp_path, no_figures):
    """No table.md at all: the per-policy and compute tables come out the same; the head says what the JSON
    holds, the step-0 diagnostics come from curves.json (its counts are not in it)."""
    out = _copy("graft_paper", tmp_path, files=("summary.json", "compute.json", "curves.json"))
    main(["compare", "--name", "graft_paper", "--results", str(tmp_path), "--report-only"])
    new, old = (out / "table.md").read_text(), (RESULTS / "graft_paper" / "table.md").read_text()
    assert new.split("\n## gpt2\n")[1] == old.split("\n## gpt2\n")[1]
    assert "| grpo | 3 | 43.4 ± 0.3 | 72.2 ± 0.5 | 14.6 ± 0.9 | — | — |" in new
    assert "| graft_no_compat | 3 | 44.3 ± 0.1 | 73.3 ± 0.3 | 15.2 ± 0.5 | +0.8 | yes |" in new
    assert "| grpo_n32 | total | 204800 | 685851 | 639427 | 335.3 | 383 |" in new
    assert "Rebuilt from summary.json and compute.json" in new and "200 steps" in new
    assert "- pass@1 at step 0: gpt2 42.5 ± 0.0 %, llama 37.1 ± 0.0 %" in new
    assert ("(pass@1 at step 0, before RL: 37.1)\n\nGRPO's own gain: +2.3 ± 3.0 points over 3 seeds (mean ± std). "
            "Minimum detectable difference vs GRPO at 3 seeds per arm, for a regime with GRPO's seed-to-seed spread: "
            "9.2 points") in new
    assert "| gpt2->llama | 83.5 ± 0.0 % | 76.5 ± 0.0 % | 7.1 ± 0.0 % | n/a | n/a |" in new
    assert "**hold**" in new


@pytest.mark.parametrize("name", ["v3", "graft_paper", "embedded", "ws1500_3seeds"])
def test_json_writers_reproduce_the_committed_json(name):
    for f, compact in (("summary.json", False), ("compute.json", False), ("curves.json", True)):
        path = RESULTS / name / f
        if path.exists():
            assert report.dump(json.loads(path.read_text()), compact=compact) == path.read_text(), f


def test_older_report_without_compute_json_is_kept(tmp_path, no_figures, capsys):
    """results/embedded predates compute.json (and the table's seeds column): its table.md is left as it is."""
    out = _copy("embedded", tmp_path)
    main(["compare", "--name", "embedded", "--results", str(tmp_path), "--report-only"])
    assert (out / "table.md").read_bytes() == (RESULTS / "embedded" / "table.md").read_bytes()
    assert "table.md kept as it is: its compute table needs compute.json" in capsys.readouterr().out
    assert no_figures == [out]


@pytest.mark.parametrize("run", ["grpo", "sgt"])
def test_real_pair_report_regenerates_from_report_json(tmp_path, run, capsys):
    out = tmp_path / "real" / run
    out.mkdir(parents=True)
    shutil.copy(RESULTS / "real" / run / "report.json", out / "report.json")
    main(["compare", "real", "--out", str(out), "--report-only"])
    assert (out / "report.md").read_bytes() == (RESULTS / "real" / run / "report.md").read_bytes()
    assert "rebuilt from report.json" in capsys.readouterr().out


def test_real_pair_report_only_needs_a_log_or_json(tmp_path):
    with pytest.raises(SystemExit, match="nothing to report"):
        main(["compare", "real", "--out", str(tmp_path / "none"), "--report-only"])
