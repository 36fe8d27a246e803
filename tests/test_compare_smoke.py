"""The regime-comparison driver runs end to end in its 2-step, 1-seed smoke mode and writes its outputs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")


def test_compare_regimes_smoke(tmp_path):
    path = Path(__file__).parents[1] / "scripts" / "compare_regimes.py"
    spec = importlib.util.spec_from_file_location("compare_regimes", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--name", "smoke", "--smoke", "--results", str(tmp_path), "--regimes", "grpo", "sgt", "graft"])
    out = tmp_path / "smoke"
    figures = ("pass_at_1.png", "entropy_kl.png", "transfers.png", "pass_at_1_final.png")
    for name in ("table.md", "diagnostics.md", "summary.json", "curves.json", *figures):
        assert (out / name).exists(), name
    table = (out / "table.md").read_text()
    assert "| sgt |" in table and "| graft |" in table and "## gpt2" in table and "## llama" in table
    # resumable: a second call finds every run done and only rebuilds the report
    mod.main(["--name", "smoke", "--smoke", "--results", str(tmp_path), "--regimes", "grpo", "sgt", "graft"])
    assert all((out / "runs" / f"{r}-s0" / "done.json").exists() for r in ("grpo", "sgt", "graft"))
    # the figures are redrawn from summary.json + curves.json alone (no runs needed)
    for name in figures:
        (out / name).unlink()
    mod.main(["--name", "smoke", "--results", str(tmp_path), "--from-summary"])
    assert all((out / name).stat().st_size > 0 for name in figures)
