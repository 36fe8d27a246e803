"""Benchmark: share of a mutual training step spent in THL code (goal <= 5 %).

What is measured
----------------
A full mutual step (the work of ``MutualRLModule.training_step`` without Lightning; the driver is
``bench_mutual_step.Side.step``) with a regime whose peers cross tokenizers as text, and inside it the time
spent in the Tokenizer Heterogeneity Layer, found by wrapping these functions with timers (monkeypatched where
their callers look them up) in the same run:

* ``cross_rollouts`` (``regimes.crossing``, as imported by prp / sgt / graft / hacpo): a peer's responses
  re-encoded by the receiver and, with trace alignment, their traces aligned; it contains
* ``encode_with_offsets`` (retokenization with character offsets) and ``align_traces`` (span/word alignment of
  the source log-prob traces onto the receiver's tokens), reported as a breakdown;
* ``offsets_by_decoding`` (``rollout.hf``): character offsets of every sampled response, computed during rollouts.

THL time = ``cross_rollouts`` + ``offsets_by_decoding`` (the nested functions are already inside
``cross_rollouts``); share = THL time / step time, per step, median over ``--pairs`` steps after ``--warmup``,
per regime. Regimes (default): ``prp`` with ``denominator: peer_aligned`` (aligned traces), ``sgt``, ``graft``.
Timer overhead (two ``perf_counter`` calls per wrapped call) is included in the THL time, so the share is an
upper bound.

Usage::

    MUTUAL_RL_CACHE=/tmp/mrl_cache python scripts/bench_thl_share.py [--regimes prp sgt graft] [--policies 2]
        [--pairs 20] [--warmup 2]
    python scripts/bench_thl_share.py --pair real --regimes sgt graft --pairs 8   # configs/real's pair
"""

from __future__ import annotations

import argparse
import importlib
import random
import statistics
import time
from collections import defaultdict

import torch
from bench_mutual_step import add_common_args, build, describe, problems_for

from mutual_rl.types import PromptBatch

TIMERS: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)

# (module, attribute, timer name): every place a THL function is looked up during a step
WRAP = [
    ("mutual_rl.regimes.prp", "cross_rollouts", "cross_rollouts"),
    ("mutual_rl.regimes.sgt", "cross_rollouts", "cross_rollouts"),
    ("mutual_rl.regimes.graft", "cross_rollouts", "cross_rollouts"),
    ("mutual_rl.regimes.hacpo", "cross_rollouts", "cross_rollouts"),
    ("mutual_rl.regimes.crossing", "encode_batch_with_offsets", "  encode_batch_with_offsets"),
    ("mutual_rl.regimes.crossing", "align_traces", "  align_traces"),
    ("mutual_rl.rollout.hf", "offsets_by_decoding", "offsets_by_decoding"),
]
TOP_LEVEL = ("cross_rollouts", "offsets_by_decoding")


def timed(fn, name):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TIMERS[name] += time.perf_counter() - t0
            CALLS[name] += 1

    wrapper.__wrapped__ = fn
    return wrapper


def install() -> None:
    for mod_name, attr, name in WRAP:
        mod = importlib.import_module(mod_name)
        setattr(mod, attr, timed(getattr(mod, attr), name))


def run(regime: str, k: int, args, problems) -> dict[str, list[float]]:
    mutual, _, _ = build(k, args, regime)
    rec: dict[str, list[float]] = defaultdict(list)
    for i in range(args.warmup + args.pairs):
        batch = PromptBatch(index=i, problems=problems[i * args.prompts : (i + 1) * args.prompts])
        torch.manual_seed(args.seed * 100003 + i)
        random.seed(args.seed * 100003 + i)
        TIMERS.clear()
        CALLS.clear()
        step = mutual.step(batch, i)["total"]
        thl = sum(TIMERS[n] for n in TOP_LEVEL)
        if i >= args.warmup:
            rec["step"].append(step)
            rec["thl"].append(thl)
            rec["share"].append(thl / step)
            for name in {n for _, _, n in WRAP}:
                rec[name].append(TIMERS[name])
                rec[f"calls:{name}"].append(CALLS[name])
        print(f"  {regime} N={k} step {i}: {step:.3f}s, THL {1e3 * thl:.1f} ms ({100 * thl / step:.2f} %)"
              f"{'  (warm-up)' if i < args.warmup else ''}", flush=True)
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap)
    ap.add_argument("--regimes", nargs="+", default=["prp", "sgt", "graft"])
    ap.add_argument("--policies", type=int, default=2, choices=[2, 3, 4])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    install()
    problems = problems_for(args)
    print(f"N={args.policies} policies; {describe(args)}; threads {torch.get_num_threads()}; {args.warmup} warm-up + {args.pairs} measured steps")
    results = {r: run(r, args.policies, args, problems) for r in args.regimes}
    names = sorted({n for _, _, n in WRAP}, key=lambda n: [x for _, _, x in WRAP].index(n))
    print(f"\nmedian per step (ms) over {args.pairs} steps; calls per step in brackets")
    print(f"{'':24s}" + "".join(f"{r:>16s}" for r in results))
    print(f"{'step':24s}" + "".join(f"{1e3 * statistics.median(v['step']):16.1f}" for v in results.values()))
    for n in names:
        print(f"{n:24s}" + "".join(
            f"{1e3 * statistics.median(v[n]):10.2f} [{statistics.median(v['calls:' + n]):3.0f}]"
            for v in results.values()))
    print(f"{'THL total':24s}" + "".join(f"{1e3 * statistics.median(v['thl']):16.2f}" for v in results.values()))
    for r, v in results.items():
        print(f"THL share of a mutual step, regime {r}{' (peer_aligned)' if r == 'prp' else ''}, "
              f"N={args.policies}: {100 * statistics.median(v['share']):.2f} % (median of {args.pairs} steps; "
              f"max {100 * max(v['share']):.2f} %; goal <= 5 %)")


if __name__ == "__main__":
    main()
