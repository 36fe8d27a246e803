"""Small statistics and number formats shared by the tables and figures (over seeds)."""

from __future__ import annotations

import math


def mean_std(xs) -> tuple[float, float]:
    """Mean and unbiased std of the non-NaN values (std 0 for one value; both NaN for none)."""
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return float("nan"), float("nan")
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, sd


def delta_se(a: list[float], b: list[float]) -> tuple[float, float]:
    """``mean(a) - mean(b)`` and the standard error of that difference over seeds (Welch:
    ``sqrt(sd_a² / n_a + sd_b² / n_b)``), NaN values left out of both; the SE is NaN when either side has fewer
    than 2 values (one seed has no spread). The table's Δ and 'beyond spread' and the Δ figure's interval."""
    a, b = [x for x in a if not math.isnan(x)], [x for x in b if not math.isnan(x)]
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    se = math.sqrt(sa**2 / len(a) + sb**2 / len(b)) if len(a) > 1 and len(b) > 1 else float("nan")
    return ma - mb, se


def beyond_spread(a: list[float], b: list[float]) -> str:
    """'yes' iff |mean(a) - mean(b)| > 2 standard errors of the difference (Welch), over seeds."""
    delta, se = delta_se(a, b)
    if math.isnan(delta) or math.isnan(se):
        return "n/a (1 seed)"
    return "yes" if abs(delta) > 2 * se else "no"


def pct(vals) -> str:
    """``m ± sd %`` over seeds (``m %`` for one value, ``n/a`` for none)."""
    m, sd = mean_std(vals)
    return "n/a" if math.isnan(m) else (f"{100 * m:.1f} %" if len(vals) < 2 else f"{100 * m:.1f} ± {100 * sd:.1f} %")


def count(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.0f}" if x == int(x) else f"{x:.1f}"


PLOT_EXTRA = 'pip install "mutual-rl[plot]"'
"""The extra that draws the figures and computes the tables' t quantiles (matplotlib, scipy)."""


def require_plot_extra() -> None:
    """SystemExit naming the extra when matplotlib or scipy is missing: checked before a comparison starts, so that
    hours of runs do not end in a report that cannot be written."""
    import importlib.util

    missing = [m for m in ("matplotlib", "scipy") if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"[compare] the report needs {' and '.join(missing)} (its figures and t quantiles): "
                         f"{PLOT_EXTRA}")


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom, 0.5 < p < 1 (``scipy.stats.t``)."""
    if not 0.5 < p < 1:
        raise ValueError(f"t_quantile: p must be in (0.5, 1), got {p}")
    try:
        from scipy.stats import t
    except ImportError as err:
        raise ImportError(f"the comparison's tables need scipy: {PLOT_EXTRA}") from err
    return float(t.ppf(p, df))


def min_detectable_difference(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The difference of means that a two-sided two-sample t-test with ``n`` seeds per arm detects at level
    ``alpha`` with probability ≈ ``power`` when both arms have the seed-to-seed standard deviation ``sd``:
    ``(t_{1-α/2, 2n-2} + t_{power, 2n-2}) · sd · sqrt(2 / n)`` (the usual central-t approximation; 3.03 × sd at
    n = 3). NaN for fewer than 2 seeds or a NaN sd."""
    if n < 2 or math.isnan(sd):
        return float("nan")
    df = 2 * n - 2
    return (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * sd * math.sqrt(2 / n)
