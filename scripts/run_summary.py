"""One run's held-out figures from its TensorBoard events: per evaluation step, each policy's pass@1 (overall and
per skill), and at the first evaluation the complementarity of each direction (share, mixed and all-pass
fractions, all-fail count); then the mean of the training-step metrics (reward, approx-KL, entropy) over the
first and last 50 steps (NaN entries left out).

Usage::

    python scripts/run_summary.py runs/grpo/version_0 [more version folders ...]
"""

from __future__ import annotations

import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def summarize(folder: str) -> None:
    acc = EventAccumulator(folder, size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    series = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in tags}
    policies = sorted({t.split("/")[0] for t in tags if t.endswith("/val/pass@1")})
    print(f"== {folder}")
    for p in policies:
        cols = [f"{p}/val/pass@1"] + sorted(t for t in tags if t.startswith(f"{p}/val/pass@1/"))
        steps = [s for s, _ in series[cols[0]]]
        head = " ".join(f"{c.split('/')[-1] if c != cols[0] else 'all':>7}" for c in cols)
        print(f"  {p:<6} step {head}")
        for s in steps:
            vals = " ".join(f"{100 * dict(series[c]).get(s, float('nan')):7.1f}" for c in cols)
            print(f"  {'':<6} {s:>4} {vals}")
    comp = sorted(t for t in tags if t.startswith("complementarity/") and t.count("/") == 1)
    for t in comp:
        first = series[t][0][0]
        parts = {k: dict(series.get(f"{t}/{k}", [])).get(first) for k in ("all_fail", "mixed_frac", "all_pass_frac")}
        print(f"  {t} @ step {first}: share {100 * series[t][0][1]:.0f} %, all-fail {parts['all_fail']:.0f}, "
              f"mixed {100 * (parts['mixed_frac'] or float('nan')):.0f} %, all-pass "
              f"{100 * (parts['all_pass_frac'] or float('nan')):.0f} %"
              + ("" if len(series[t]) < 2 else f"; last (step {series[t][-1][0]}) share {100 * series[t][-1][1]:.0f} %"))
    for p in policies:
        row = []
        for m in ("reward", "approx_kl", "entropy"):
            v = series.get(f"{p}/{m}")
            if v:
                a = [x for _, x in v[:50] if x == x]
                b = [x for _, x in v[-50:] if x == x]
                row.append(f"{m} {sum(a) / max(1, len(a)):.3f} -> {sum(b) / max(1, len(b)):.3f}")
        print(f"  {p}: " + ", ".join(row))


if __name__ == "__main__":
    for f in sys.argv[1:]:
        summarize(f)
