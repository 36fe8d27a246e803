"""Runs side by side on one CPU: step time of a lone run vs two concurrent runs, with and without a thread budget.

Each run is ``configs/grpo.yaml`` (the embedded pair) for ``--steps`` training steps, no evaluation, no logger;
the step time is the median over the steps after ``--warmup``. Scenarios, measured one after the other:

1. one run alone, default threads (``model.num_threads: null``: torch's count capped at this process's cores);
2. two runs at once, default threads each (each thinks it has every core: oversubscription);
3. two runs at once, ``model.num_threads`` = cores / 2 each.

Prints one line per scenario and run, and each concurrent run's step time as a multiple of the lone run's.

    python scripts/bench_threads.py --steps 40 --warmup 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(args) -> None:
    import lightning.pytorch as pl
    import torch

    from mutual_rl.cli import build_cli

    class StepTimer(pl.Callback):
        def __init__(self):
            self.times, self._t0 = [], None

        def on_train_batch_start(self, *a):
            self._t0 = time.perf_counter()

        def on_train_batch_end(self, *a):
            self.times.append(time.perf_counter() - self._t0)

    cli_args = ["--config", str(ROOT / "configs" / "grpo.yaml"), "--trainer.max_steps", str(args.steps),
                "--trainer.logger", "false",
                "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false",
                "--model.eval_at_start", "false", "--model.log_samples_every_n_steps", "0",
                "--model.export_dir", str(Path(args.out).with_suffix("")) + "_export",
                "--trainer.default_root_dir", str(Path(args.out).parent)]
    if args.num_threads:
        cli_args += ["--model.num_threads", str(args.num_threads)]
    cli = build_cli(cli_args, run=False)
    timer = StepTimer()
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    steps = timer.times[args.warmup:]
    Path(args.out).write_text(json.dumps({"median_s": statistics.median(steps) if steps else 0.0,
                                          "threads": torch.get_num_threads(),
                                          "steps": len(steps)}))


def launch(args, tag: str, num_threads: int | None, tmp: Path) -> subprocess.Popen:
    out = tmp / f"{tag}.json"
    cmd = [sys.executable, __file__, "--worker", "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--out", str(out)] + (["--num-threads", str(num_threads)] if num_threads else [])
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), out


def run(args, scenario: str, n: int, num_threads: int | None, tmp: Path) -> list[dict]:
    procs = [launch(args, f"{scenario}-{i}", num_threads, tmp) for i in range(n)]
    results = []
    for p, out in procs:
        _, err = p.communicate()
        if p.returncode:
            raise SystemExit(f"{scenario}: a run failed:\n{err[-3000:]}")
        results.append(json.loads(out.read_text()))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--num-threads", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    from mutual_rl.threads import available_cores

    cores = available_cores()
    tmp = ROOT / "runs" / "bench_threads"
    tmp.mkdir(parents=True, exist_ok=True)
    print(f"{cores} cores; configs/grpo.yaml, {args.steps} steps, median step time over the last "
          f"{args.steps - args.warmup}; presets built first", flush=True)
    run(argparse.Namespace(steps=0, warmup=0), "prepare", 1, None, tmp)  # builds (or loads) the cached presets
    lone = run(args, "lone", 1, None, tmp)[0]
    print(f"lone run, default threads ({lone['threads']}): {lone['median_s']:.3f} s/step", flush=True)
    budget = max(1, cores // 2)
    for scenario, threads in (("two at once, default threads", None),
                              (f"two at once, num_threads {budget} each", budget)):
        res = run(args, scenario.replace(" ", "_").replace(",", ""), 2, threads, tmp)
        cells = ", ".join(f"{r['median_s']:.3f} s/step ({r['median_s'] / lone['median_s']:.2f}x lone, "
                          f"{r['threads']} threads)" for r in res)
        print(f"{scenario}: {cells}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
