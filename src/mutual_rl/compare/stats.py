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


def beyond_spread(a: list[float], b: list[float]) -> str:
    """'yes' iff |mean(a) - mean(b)| > 2 standard errors of the difference (Welch), over seeds."""
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    if len(a) < 2 or len(b) < 2 or math.isnan(ma) or math.isnan(mb):
        return "n/a (1 seed)"
    se = math.sqrt(sa**2 / len(a) + sb**2 / len(b))
    return "yes" if abs(ma - mb) > 2 * se else "no"


def pct(vals) -> str:
    """``m ± sd %`` over seeds (``m %`` for one value, ``n/a`` for none)."""
    m, sd = mean_std(vals)
    return "n/a" if math.isnan(m) else (f"{100 * m:.1f} %" if len(vals) < 2 else f"{100 * m:.1f} ± {100 * sd:.1f} %")


def count(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.0f}" if x == int(x) else f"{x:.1f}"
