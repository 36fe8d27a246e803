"""Benchmark: one N-policy mutual training step vs the sum of N single-policy steps (goal <= 1.05x).

What is measured
----------------
*Mutual step* (N = 2 and N = 4 policies): exactly the work of ``MutualRLModule.training_step`` minus Lightning's
logging: :func:`mutual_rl.step.pipeline.run_step` with plain AdamW and no THL residual report -- per policy its
rollouts (HF ``generate``), rewards and GRPO advantages, published to the exchange; per receiver its learning rate,
``regime.plan`` on its own groups and its deliveries, the exchange's accounting of every flow, ``update_policy``;
``exchange.end_step`` (accounting check). *Single steps*: the same for a one-policy module of each policy, run one after the other;
their times are summed. The ratio is mutual / sum of singles: the orchestration overhead of training N policies
in one module (and, with a sharing ``--regime``, the extra work of that regime on top).

Matched: the two sides train separate deep copies of the same warm-started presets on the same prompts, and
each pair seeds torch/random identically before either side, so both sides sample the same rollouts and apply
the same updates (their weights stay equal; mean response lengths are printed as a check). Pairs alternate
which side runs first; the result is the median over ``--pairs`` pairs after ``--warmup`` pairs.

Policies: N = 2: tiny:gpt2-bpe + tiny:llama-char; N = 4: + tiny:llama-bpe + a second tiny:gpt2-bpe (seed 1).
Presets are warm-started ``--warmstart-steps`` steps on the built-in task (built once, cached under
``$MUTUAL_RL_CACHE``) so groups have mixed rewards and updates do real forward/backward work.

The real pair (``--pair real``): the two policies of ``configs/real/base.yaml`` exactly as that config sets them
(SmolLM2-135M-Instruct from its GGUF + ``tiny:qwen-vocab`` on Qwen's 151k vocabulary, each in its own chat
template; sampling, learning rates, warm-up, the question-style boxed task, ``boxed_integer_match``, 2 mini-batches,
4 prompts per step), with the regime's arguments of its config (``sgt``: coef 0.1, ``configs/real/sgt.yaml``).
``--prompts``/``--n``/``--max-new-tokens``/``--lr``/``--warmstart-steps`` do not apply to it.

Usage::

    MUTUAL_RL_CACHE=/tmp/mrl_cache python scripts/bench_mutual_step.py [--pairs 20] [--warmup 2]
        [--regime none|xgrpo|prp|sgt|graft|hacpo] [--policies 2 4] [--threads 1]
    python scripts/bench_mutual_step.py --pair real --regime sgt --policies 2 --pairs 8
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time
from pathlib import Path

import torch

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import OptimizerSpec, PolicySpec, SamplingSpec, WarmStart
from mutual_rl.module import MutualRLModule
from mutual_rl.regimes import get_regime
from mutual_rl.rewards import get_reward
from mutual_rl.step.pipeline import StepContext, run_step
from mutual_rl.types import PromptBatch
from mutual_rl.update.config import GRPOConfig

PRESETS = [("gpt2", "tiny:gpt2-bpe", 0), ("llama", "tiny:llama-char", 0), ("llamabpe", "tiny:llama-bpe", 0),
           ("gpt2b", "tiny:gpt2-bpe", 1)]


def add_common_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--pairs", type=int, default=20, help="measured pairs (steps)")
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured pairs first")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--warmstart-steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pair", choices=("tiny", "real"), default="tiny",
                    help="tiny: the tiny presets (default); real: configs/real's SmolLM2-135M + tiny:qwen-vocab")


def specs(k: int, args) -> list[PolicySpec]:
    return [
        PolicySpec(name=name, model=model, seed=seed, warmstart=WarmStart(steps=args.warmstart_steps),
                   optimizer=OptimizerSpec(lr=args.lr, betas=(0.9, 0.99), weight_decay=0.01, grad_clip=1.0),
                   sampling=SamplingSpec(n=args.n, temperature=1.0, top_p=1.0, top_k=0,
                                         max_new_tokens=args.max_new_tokens))
        for name, model, seed in PRESETS[:k]
    ]


def regime_args(regime: str, pair: str = "tiny") -> dict:
    """Arguments of the sharing regimes as the shipped configs use them (THL-crossing variants)."""
    if pair == "real":
        return {"sgt": {"coef": 0.1}}.get(regime, {})  # configs/real/sgt.yaml
    return {"prp": {"denominator": "peer_aligned"}, "sgt": {"coef": 0.3}}.get(regime, {})


REAL_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "real" / "base.yaml"


def real_setup():
    """(policy specs, task, reward name, algorithm) of ``configs/real/base.yaml``, parsed as ``mutual-rl fit``
    parses it."""
    import sys

    from mutual_rl.cli import build_cli

    argv, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI parses the args given here, not this script's
    try:
        cli = build_cli(["--config", str(REAL_CONFIG), "--trainer.logger", "false"], run=False)
    finally:
        sys.argv = argv
    task = cli.datamodule.task
    reward = cli.model.reward_name or getattr(task, "default_reward", "integer_match")  # as the module resolves it
    return list(cli.model.specs), task, reward, cli.model.algorithm


def problems_for(args) -> list:
    """The training problems of the benchmark's task, in order; for ``--pair real`` also sets ``args.prompts`` to
    the real config's prompts per step (``data.batch_size``)."""
    if getattr(args, "pair", "tiny") == "real":
        import yaml

        data = yaml.safe_load(REAL_CONFIG.read_text())["data"]
        args.prompts = data["batch_size"]
        return ArithmeticTask(**data["task"]).train_problems()
    return ArithmeticTask().train_problems()


def describe(args) -> str:
    if getattr(args, "pair", "tiny") == "real":
        return f"the real pair of {REAL_CONFIG.relative_to(REAL_CONFIG.parents[2])} ({args.prompts} prompts per step)"
    return f"{args.prompts} prompts x {args.n} samples, <= {args.max_new_tokens} new tokens"


class Side:
    """A MutualRLModule (no Trainer) over its own copies of ``policies``, with one AdamW per policy."""

    def __init__(self, policies, regime: str, algo: GRPOConfig, reward: str = "integer_match", pair: str = "tiny"):
        self.module = MutualRLModule([p.spec for p in policies], algorithm=algo,
                                     regime=get_regime(regime, **regime_args(regime, pair)), log_samples_every_n_steps=0)
        for p in policies:
            self.module.policies[p.name] = copy.deepcopy(p)
        self.module.reward_fn = get_reward(reward)
        self.opts = {}
        for p in self.module.specs:
            o = p.optimizer
            params = [x for x in self.module.policies[p.name].parameters() if x.requires_grad]
            self.opts[p.name] = torch.optim.AdamW(params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, eps=o.eps)

    def step(self, batch: PromptBatch, step: int) -> dict[str, float]:
        """``training_step``'s work (module docstring): :func:`mutual_rl.step.pipeline.run_step`; returns seconds
        and the mean response length."""
        m = self.module
        ctx = StepContext(specs=m.specs, policies=m.policies, regimes=m.regimes, algorithm=m.algorithm, engine=m.engine,
                          exchange=m.exchange, reward_fn=m.reward_fn, optimizers=self.opts,
                          thl_residual_every_n_steps=0)
        t0 = time.perf_counter()
        report = run_step(ctx, batch, step)
        total = time.perf_counter() - t0
        return {"total": total, "len": statistics.mean(r.rollout.response_length for r in report.policies.values())}


def build(k: int, args, regime: str):
    """(mutual side, single sides) over the same k warm-started policies."""
    if getattr(args, "pair", "tiny") == "real":
        if k != 2:
            raise SystemExit("--pair real is a pair: use --policies 2")
        real_specs, task, reward, algo = real_setup()
        policies = [build_policy(s, task=task) for s in real_specs]
        return (Side(policies, regime, algo, reward, "real"),
                [Side([p], regime, algo, reward, "real") for p in policies], task)
    task = ArithmeticTask()
    policies = [build_policy(s, task=task) for s in specs(k, args)]
    algo = GRPOConfig(num_mini_batches=2, old_logp="rollout")
    return Side(policies, regime, algo), [Side([p], regime, algo) for p in policies], task


def seeded(seed: int, fn, *args):
    torch.manual_seed(seed)
    random.seed(seed)
    return fn(*args)


def run_singles(singles, batch: PromptBatch, step: int, seed: int) -> dict[str, float]:
    """The single-policy steps one after the other from the same seed (the mutual step samples its policies in
    the same order from one stream, so both sides draw the same rollouts); their times summed."""
    rs = seeded(seed, lambda: [s.step(batch, step) for s in singles])
    return {"total": sum(r["total"] for r in rs), "len": statistics.mean(r["len"] for r in rs)}


def run_pairs(k: int, args, regime: str, problems) -> dict[str, list[float]]:
    mutual, singles, _ = build(k, args, regime)
    rec: dict[str, list[float]] = {"mutual": [], "singles": [], "ratio": [], "len_m": [], "len_s": []}
    for i in range(args.warmup + args.pairs):
        batch = PromptBatch(index=i, problems=problems[i * args.prompts : (i + 1) * args.prompts])
        seed = args.seed * 100003 + i

        if i % 2:
            s, m = run_singles(singles, batch, i, seed), seeded(seed, mutual.step, batch, i)
        else:
            m, s = seeded(seed, mutual.step, batch, i), run_singles(singles, batch, i, seed)
        tag = "warm-up" if i < args.warmup else f"pair {i - args.warmup + 1:2d}"
        print(f"  N={k} {tag}: mutual {m['total']:.3f}s  sum of singles {s['total']:.3f}s  "
              f"ratio {m['total'] / s['total']:.3f}  (len {m['len']:.2f} / {s['len']:.2f})", flush=True)
        if i >= args.warmup:
            rec["mutual"].append(m["total"])
            rec["singles"].append(s["total"])
            rec["ratio"].append(m["total"] / s["total"])
            rec["len_m"].append(m["len"])
            rec["len_s"].append(s["len"])
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap)
    ap.add_argument("--regime", default="none", help="sharing regime of every policy (default none)")
    ap.add_argument("--policies", type=int, nargs="+", default=[2, 4], choices=[1, 2, 3, 4])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    problems = problems_for(args)
    print(f"regime {args.regime}; {describe(args)}; threads {torch.get_num_threads()}; {args.warmup} warm-up + {args.pairs} measured pairs")
    summary = []
    for k in args.policies:
        r = run_pairs(k, args, args.regime, problems)
        ratio = statistics.median(r["mutual"]) / statistics.median(r["singles"])
        summary.append((k, ratio, statistics.median(r["ratio"]), statistics.median(r["mutual"]),
                        statistics.median(r["singles"]), statistics.mean(r["len_m"]), statistics.mean(r["len_s"])))
    print("\nN  median mutual  median sum-of-singles  ratio of medians  median pair ratio  mean len (m/s)")
    for k, ratio, pr, tm, ts, lm, ls in summary:
        print(f"{k}  {tm:12.3f}s  {ts:20.3f}s  {ratio:16.3f}  {pr:17.3f}  {lm:.2f}/{ls:.2f}")
    for k, ratio, pr, *_ in summary:
        print(f"mutual/singles step time, N={k}, regime {args.regime}: {ratio:.3f} (median pair ratio {pr:.3f}; "
              f"goal <= 1.05)")
    import resource

    print(f"peak resident memory of this process (both sides' copies of every policy): "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
