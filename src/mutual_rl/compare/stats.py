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


def t_cdf(x: float, df: int) -> float:
    """Student's t distribution function with an integer ``df`` >= 1, in closed form (Abramowitz & Stegun 26.7.3
    and 26.7.4, with ``θ = atan(x / sqrt(df))``): exact for every ``x``, ``±inf`` included."""
    if int(df) != df or df < 1:
        raise ValueError(f"t_cdf: df must be an integer >= 1, got {df}")
    df = int(df)
    if math.isnan(x):
        return float("nan")
    theta = math.atan(x / math.sqrt(df)) if not math.isinf(x) else math.copysign(math.pi / 2, x)
    c2, sin = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:  # odd: (2/π) (θ + sin θ (cos θ + (2/3) cos³θ + ... up to cos^{df-2} θ))
        term, total = math.cos(theta), 0.0
        for k in range(1, (df - 1) // 2 + 1):
            total += term
            term *= c2 * (2 * k) / (2 * k + 1)
        a = 2 / math.pi * (theta + sin * total)
    else:  # even: sin θ (1 + (1/2) cos²θ + (1·3)/(2·4) cos⁴θ + ... up to cos^{df-2} θ)
        term, total = 1.0, 0.0
        for k in range(1, df // 2 + 1):
            total += term
            term *= c2 * (2 * k - 1) / (2 * k)
        a = sin * total
    return 0.5 + a / 2  # a = P(|T| <= x) signed like x


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom, 0.5 < p < 1 (bisection on :func:`t_cdf`)."""
    if not 0.5 < p < 1:
        raise ValueError(f"t_quantile: p must be in (0.5, 1), got {p}")
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def min_detectable_difference(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The difference of means that a two-sided two-sample t-test with ``n`` seeds per arm detects at level
    ``alpha`` with probability ≈ ``power`` when both arms have the seed-to-seed standard deviation ``sd``:
    ``(t_{1-α/2, 2n-2} + t_{power, 2n-2}) · sd · sqrt(2 / n)`` (the usual central-t approximation; 3.03 × sd at
    n = 3). NaN for fewer than 2 seeds or a NaN sd."""
    if n < 2 or math.isnan(sd):
        return float("nan")
    df = 2 * n - 2
    return (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * sd * math.sqrt(2 / n)
