"""What running a reward in its worker process costs (``model.reward_isolation``), per call, against in process.

    python scripts/bench_reward_isolation.py [--calls 3000] [--group 8]

For the shipped text-style rewards and a custom ``module:function`` (a small regex reward, written to a temporary
module), each called through the run's guard (:class:`~mutual_rl.rewards.guard.GuardedReward`, 5 s limit) on
realistic completions (~300 characters, a boxed answer): the median time per call in the trainer's process
(``isolation: none``) and in a worker process (``all``), their ratio, and what the difference adds to a step that
scores 64 completions. Also a TRL-style custom reward on groups of ``--group`` completions (one call per group), the
worker's start-up (first call: a fresh interpreter plus the reward's module), and the restart after a timeout.
``math_verify`` is not listed: it runs in its own worker whatever the setting (:mod:`mutual_rl.rewards.verify`).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mutual_rl.rewards import build_reward
from mutual_rl.rewards.isolation import close_workers
from mutual_rl.types import Problem

SHIPPED = ["integer_match", "boxed_integer_match", "last_integer", "boxed_format"]
STEP_CALLS = 64

CUSTOM = """
import re

BOXED = re.compile(r"\\\\boxed\\{([^{}]*)\\}")


def boxed_equal(completion, answer):
    found = BOXED.findall(completion)
    return float(bool(found) and found[-1].strip() == answer.strip())


def boxed_equal_trl(prompts, completions, answer, **columns):
    return [boxed_equal(c, a) for c, a in zip(completions, answer)]


def slow(completion, answer):
    import time
    time.sleep(10)
    return 0.0
"""


def _completions(n: int) -> list[tuple[str, str]]:
    out = []
    for i in range(n):
        a, b = 10 + i % 90, 3 + i % 7
        text = (f"We need {a} + {b}. First add the tens, then the units; carrying where needed gives the sum. "
                f"Checking by subtracting {b} from the result gives {a} again, so the answer is "
                f"\\boxed{{{a + b + (i % 3 == 0)}}}. " + "Some more reasoning text follows. " * 4)
        out.append((text, str(a + b)))
    return out


def _per_call_us(reward, pairs, *, group: int = 0) -> float:
    """Median over 5 rounds of the time per call, in microseconds (after 20 warm-up calls)."""
    if group:
        problems = [Problem(i, "x+y=", a) for i, (_, a) in enumerate(pairs[::group])]
        groups = [[c for c, _ in pairs[i * group:(i + 1) * group]] for i in range(len(problems))]

        def run(k):
            for p, g in zip(problems[:k], groups[:k]):
                reward.score_group(p, g)
        unit = len(problems)
    else:
        def run(k):
            for c, a in pairs[:k]:
                reward(c, a)
        unit = len(pairs)
    run(20)
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        run(unit)
        rounds.append((time.perf_counter() - t0) / unit * 1e6)
    return statistics.median(rounds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--group", type=int, default=8)
    args = ap.parse_args()
    logging.getLogger("mutual_rl.rewards.guard").setLevel(logging.ERROR)  # the timed-out call below is expected
    tmp = Path(tempfile.mkdtemp(prefix="bench-reward-"))
    (tmp / "bench_custom_reward.py").write_text(CUSTOM)
    sys.path.append(str(tmp))
    pairs = _completions(args.calls)

    rows = []
    for name in [*SHIPPED, "bench_custom_reward:boxed_equal"]:
        inproc = _per_call_us(build_reward(name, isolation="none"), pairs)
        worker = _per_call_us(build_reward(name, isolation="all"), pairs)
        rows.append((name, inproc, worker))
    spec = "bench_custom_reward:boxed_equal_trl"
    inproc = _per_call_us(build_reward(spec, isolation="none"), pairs, group=args.group)
    worker = _per_call_us(build_reward(spec, isolation="all"), pairs, group=args.group)
    rows.append((f"{spec} (a group of {args.group})", inproc, worker))

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {args.calls} calls, median of 5 rounds\n")
    print(f"{'reward':<52} {'in process':>11} {'worker':>9} {'ratio':>7} {'+ms/64 calls':>13}")
    for name, a, b in rows:
        print(f"{name:<52} {a:>9.1f}us {b:>7.1f}us {b / a:>6.1f}x {(b - a) * STEP_CALLS / 1e3:>13.2f}")

    close_workers()
    starts = []
    for _ in range(3):
        close_workers()
        r = build_reward("bench_custom_reward:boxed_equal")
        t0 = time.perf_counter()
        r("\\boxed{1}", "1")
        starts.append((time.perf_counter() - t0) * 1e3)
    print(f"\nworker start-up (first call: interpreter + the reward module): {statistics.median(starts):.0f} ms "
          "(median of 3)")
    slow = build_reward("bench_custom_reward:slow", timeout_s=0.2, errors="skip")
    slow("a", "b")  # starts the worker, times out, kills it
    r = build_reward("bench_custom_reward:slow", timeout_s=0.2, errors="skip")
    t0 = time.perf_counter()
    r("a", "b")
    print(f"a timed-out call with a 0.2 s limit, worker restart included: {(time.perf_counter() - t0) * 1e3:.0f} ms")
    close_workers()


if __name__ == "__main__":
    main()
