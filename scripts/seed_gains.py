"""GRPO's own gain per policy over several seeds of one configuration, and the minimum detectable difference.

For each run (a TensorBoard version folder): each policy's held-out pass@1 at the first evaluation, at the last,
and the mean of the last ``--last`` evaluations (default 2; "end"). Over the runs: mean and sample standard deviation of the end
and of the gain (end - start), then, from the seed-to-seed standard deviation ``sd`` of the end, what a regime
compared with this configuration at ``n`` seeds each can resolve:

* ``2-SE``: the half-width of the 2-standard-error interval of a difference of two means, ``2 sd sqrt(2/n)``
  (what the comparison's Delta-pass@1 figure draws);
* ``MDD``: the minimum detectable difference of a two-sided two-sample t-test at alpha 0.05 with power 0.8,
  ``(t_{0.975, 2n-2} + t_{0.8, 2n-2}) sd sqrt(2/n)``.

Usage::

    python scripts/seed_gains.py [--last 2] runs/grpo/version_0 runs/grpo/version_1 runs/grpo/version_2
"""

from __future__ import annotations

import statistics
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mutual_rl.compare.stats import mean_std, min_detectable_difference


def pass1(folder: str) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(folder, size_guidance={"scalars": 0})
    acc.Reload()
    return {t.split("/")[0]: [(e.step, 100 * e.value) for e in acc.Scalars(t)]
            for t in acc.Tags()["scalars"] if t.endswith("/val/pass@1")}


def main(folders: list[str], last: int = 2) -> None:
    runs = [pass1(f) for f in folders]
    n = len(runs)
    for p in sorted(runs[0]):
        print(f"{p}:")
        ends, gains = [], []
        for f, r in zip(folders, runs):
            curve = r[p]
            start, end = curve[0][1], statistics.fmean(v for _, v in curve[-last:])
            ends.append(end)
            gains.append(end - start)
            print(f"  {f}: " + " ".join(f"{s}:{v:.1f}" for s, v in curve) + f"  end(last 2) {end:.1f}, gain "
                  f"{end - start:+.1f}")
        if n < 2:
            continue
        end_mean, sd = mean_std(ends)
        gain, gain_sd = mean_std(gains)
        mdd = min_detectable_difference(sd, n)
        print(f"  end {end_mean:.1f} +- {sd:.1f}; gain {gain:+.1f} +- {gain_sd:.1f} (min {min(gains):+.1f}); "
              f"at n = {n} seeds per arm: 2-SE "
              f"{2 * sd * (2 / n) ** 0.5:.1f} points, MDD (alpha .05, power .8) {mdd:.1f} points")


if __name__ == "__main__":
    argv = sys.argv[1:]
    k = 2
    if argv[:1] == ["--last"]:
        k, argv = int(argv[1]), argv[2:]
    main(argv, k)
