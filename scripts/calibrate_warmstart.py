"""Calibrate the tiny presets' supervised warm-up: held-out greedy accuracy and sampled pass@1 per skill for
several (steps, lr) settings, so a regime comparison starts from policies that are competent on their own skill.

Usage (each setting builds a preset into the cache, ~1-3 min per 1000 steps on a 2-core CPU)::

    python scripts/calibrate_warmstart.py --model tiny:gpt2-bpe --skills add --steps 600 1500 --lr 1e-3 3e-3

Prints one row per setting: greedy and pass@1 (k=8, T=0.6, top-p 0.95, as the configs evaluate) on each operator
of the held-out split (``--per-skill`` problems per operator).
"""

from __future__ import annotations

import argparse
import itertools
import time

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.evaluation.validation import EvalConfig, Evaluator
from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import PolicySpec, SamplingSpec, WarmStart
from mutual_rl.rewards import get_reward
from mutual_rl.rollout import get_engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny:gpt2-bpe")
    ap.add_argument("--skills", nargs="*", default=None, help="operators to warm up on (default: all)")
    ap.add_argument("--other-skill-fraction", type=float, default=0.1)
    ap.add_argument("--steps", nargs="+", type=int, default=[600])
    ap.add_argument("--lr", nargs="+", type=float, default=[1e-3])
    ap.add_argument("--per-skill", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    task = ArithmeticTask(operators=["+", "-"], digits=2, num_heldout=400)
    problems = task.heldout_problems()
    by_skill: dict[str, list] = {}
    for p in problems:
        if len(by_skill.setdefault(p.skill, [])) < args.per_skill:
            by_skill[p.skill].append(p)
    evaluation = EvalConfig(k=8, temperature=0.6, top_p=0.95)
    print(f"{'steps':>6} {'lr':>8} " + " ".join(f"{s + ' greedy':>12} {s + ' pass@1':>12}" for s in by_skill)
          + f" {'build s':>8}", flush=True)
    for steps, lr in itertools.product(args.steps, args.lr):
        warm = WarmStart(steps=steps, lr=lr, skills=args.skills, other_skill_fraction=args.other_skill_fraction
                         if args.skills else 0.0, seed=args.seed)
        spec = PolicySpec(name="p", model=args.model, warmstart=warm, sampling=SamplingSpec(max_new_tokens=8))
        t0 = time.perf_counter()
        policy = build_policy(spec, task=task)
        built = time.perf_counter() - t0
        evaluator = Evaluator(evaluation, get_reward("integer_match"), get_engine("hf"))
        evaluator.start(args.seed)
        for skill_problems in by_skill.values():
            evaluator.add(policy, skill_problems)
        m = evaluator.finish()["p"]
        cells = " ".join(f"{100 * m[f'greedy/{s}']:>12.1f} {100 * m[f'pass@1/{s}']:>12.1f}" for s in by_skill)
        print(f"{steps:>6} {lr:>8.0e} {cells} {built:>8.0f}", flush=True)
        del policy


if __name__ == "__main__":
    main()
