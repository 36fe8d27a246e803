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
