"""The minimum detectable difference in the comparison's tables: Student's t quantiles against printed tables, the
power formula by hand, and the line under each policy's table."""

from __future__ import annotations

import math

import pytest

from mutual_rl.compare.report import grpo_gain_text
from mutual_rl.compare.stats import min_detectable_difference, t_quantile


@pytest.mark.parametrize("p,df,expected", [
    (0.975, 1, 12.7062), (0.975, 4, 2.7764), (0.975, 10, 2.2281), (0.975, 30, 2.0423),
    (0.8, 4, 0.9410), (0.8, 10, 0.8791), (0.95, 2, 2.9200),
])
def test_t_quantiles_match_the_printed_table(p, df, expected):
    assert t_quantile(p, df) == pytest.approx(expected, abs=1e-4)


def test_t_quantile_range_and_far_tail():
    # Cauchy's 0.9999 quantile is cot(π / 10^4)
    assert t_quantile(0.9999, 1) == pytest.approx(1 / math.tan(math.pi * 1e-4), rel=1e-9)
    with pytest.raises(ValueError, match="p must be in"):
        t_quantile(0.4, 3)


def test_min_detectable_difference_by_hand():
    # 3 seeds per arm: df 4, (2.7764 + 0.9410) * sqrt(2/3) = 3.0352 per unit sd
    assert min_detectable_difference(1.0, 3) == pytest.approx(3.0352, abs=1e-3)
    assert min_detectable_difference(0.5, 3) == pytest.approx(1.5176, abs=1e-3)
    # 6 seeds per arm: df 10, (2.2281 + 0.8791) * sqrt(1/3) = 1.7939
    assert min_detectable_difference(1.0, 6) == pytest.approx(1.7939, abs=1e-3)
    assert math.isnan(min_detectable_difference(1.0, 1)) and math.isnan(min_detectable_difference(float("nan"), 3))


def test_grpo_gain_line():
    # GRPO ends 0.59, 0.60, 0.61 from 0.48: gain +12.0 ± 1.0; MDD 3.0352 * 1.0
    line = grpo_gain_text([0.59, 0.60, float("nan"), 0.61], 0.48)
    assert line == ("GRPO's own gain: +12.0 ± 1.0 points over 3 seeds (mean ± std). Minimum detectable difference "
                    "vs GRPO at 3 seeds per arm, for a regime with GRPO's seed-to-seed spread: 3.0 points (two-sided "
                    "t-test, α 0.05, power ≈ 0.8; 'beyond spread' is the looser |Δ| > 2 SE).")
    assert "spread: n/a (no spread over seeds)" in grpo_gain_text([0.6, 0.6], 0.48)
    assert grpo_gain_text([0.59], 0.48) == "GRPO's own gain: +11.0 points (1 seed)."
    assert grpo_gain_text([], 0.48) == "" and grpo_gain_text([0.5], float("nan")) == ""


def test_a_comparison_without_the_plot_extra_stops_before_any_run(monkeypatch, tmp_path):
    """Checked at the start: hours of runs must not end in a report that cannot be written."""
    import importlib.util

    from mutual_rl.compare.cli import compare
    from mutual_rl.compare.stats import PLOT_EXTRA, require_plot_extra

    require_plot_extra()  # both installed here (the dev extra)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "scipy" else real(name, *a))
    with pytest.raises(SystemExit, match="needs scipy") as err:
        compare(name="x", regimes=("grpo",), seeds=(0,), results=str(tmp_path))
    assert PLOT_EXTRA in str(err.value) and not (tmp_path / "x").exists()
