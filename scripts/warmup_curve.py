"""The learning curve of one tiny preset's supervised warm-up under a *constant* learning rate, with every
checkpoint stored in the preset cache as the build of that many steps would be.

With ``schedule: constant`` the first N steps of a longer warm-up are exactly an N-step warm-up (same batches,
same AdamW state, nothing depends on the total), so one run gives the quality report after 250, 500, ... steps
and leaves each checkpoint where ``mutual-rl fit`` finds it for a config with ``warmstart: {steps: N, schedule:
constant, ...}``. Run it in the pinned environment of ``presets/build_worker.py`` (one thread, AVX2 kernels) to
get the weights a pinned build would; ``--check N`` rebuilds the N-step preset through the normal cache path into
a scratch cache and compares the weights.

Usage::

    env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2,STRICT ONEDNN_MAX_CPU_ISA=AVX2 \\
        MUTUAL_RL_PINNED_WORKER=1 python scripts/warmup_curve.py --model tiny:gpt2-bpe --skills add \\
        --other-skill-fraction 0.3 --checkpoints 250 500 1000 1500 2000 3000

Prints one line per checkpoint: steps, mean loss of the last 50 steps, greedy and pass@1 (k = 8, T = 0.6, the
quality report) per skill, seconds so far.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time

import torch

from mutual_rl.data.chain import ChainTask
from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.spec import WarmStart
from mutual_rl.presets.build import deterministic_kernels
from mutual_rl.presets.cache import preset_dir, preset_key
from mutual_rl.presets.models import build_untrained
from mutual_rl.presets.quality import quality_report
from mutual_rl.presets.warmstart import select_problems, warm_start
from mutual_rl.thl.retokenize import prompt_ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny:gpt2-bpe")
    ap.add_argument("--skills", nargs="*", default=None)
    ap.add_argument("--other-skill-fraction", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0, help="preset (initialisation) seed")
    ap.add_argument("--warmstart-seed", type=int, default=0)
    ap.add_argument("--checkpoints", nargs="+", type=int, required=True)
    ap.add_argument("--no-save", action="store_true", help="report only; store nothing in the cache")
    ap.add_argument("--task", choices=["arithmetic", "chain"], default="arithmetic",
                    help="arithmetic: benchmark v3's 2-digit task; chain: v4's worked solutions (ChainTask)")
    ap.add_argument("--terms", type=int, default=3, help="chain: numbers per chain")
    args = ap.parse_args()
    task = (ArithmeticTask(operators=["+", "-"], digits=2, num_heldout=400) if args.task == "arithmetic"
            else ChainTask(terms=args.terms, num_heldout=400))
    total = max(args.checkpoints)
    prompt_template, name = "{problem}", args.model

    def spec(steps: int) -> WarmStart:
        return WarmStart(steps=steps, lr=args.lr, schedule="constant", batch_size=args.batch_size,
                         skills=args.skills, other_skill_fraction=args.other_skill_fraction, seed=args.warmstart_seed)

    model, tokenizer = build_untrained(name, args.seed)
    full = spec(total)
    pool = select_problems(task.train_problems(), full)
    t0 = time.perf_counter()
    print(f"# {name} skills={args.skills} other={args.other_skill_fraction} lr={args.lr} constant; pool "
          f"{len(pool)}; threads {torch.get_num_threads()}; isa {torch.backends.cpu.get_cpu_capability()}",
          flush=True)

    def checkpoint(n: int, losses: list[float]) -> None:
        if n not in args.checkpoints:
            return
        model.eval()
        trained = time.perf_counter() - t0
        report = quality_report(model, tokenizer, task, name=name, prompt_template=prompt_template,
                                chat_template=False)
        model.train()
        if not args.no_save:
            _save(model, tokenizer, name, args.seed, spec(n), task, prompt_template, losses, report, trained)
        cells = " ".join(f"{s} greedy {100 * v['greedy']:5.1f} pass@1 {100 * v['pass@1']:5.1f}"
                         for s, v in report["skills"].items())
        o = report["overall"]
        print(f"{n:>6} loss {sum(losses[-50:]) / len(losses[-50:]):.4f} {cells} | all pass@1 "
              f"{100 * o['pass@1']:5.1f} | train {trained:6.0f} s, total {time.perf_counter() - t0:6.0f} s",
              flush=True)

    # the build's own loop (presets/warmstart.py), seeded as presets/build.py seeds a build
    with torch.random.fork_rng(devices=[]), deterministic_kernels():
        torch.manual_seed(full.seed + args.seed)
        warm_start(model, tokenizer, task.train_problems(), lambda q: prompt_template.replace("{problem}", q),
                   task.target_text, full, desc=f"warm-up {name}",
                   encode_prompt=lambda text: prompt_ids(tokenizer, text), on_step=checkpoint)


def _save(model, tokenizer, name, seed, warmstart, task, prompt_template, losses, report, seconds) -> None:
    """Store the checkpoint in the preset cache as the ``warmstart.steps``-step build (cache.py's layout)."""
    key = preset_key(name, seed, warmstart, task, prompt_template)
    path = preset_dir(key)
    if (path / "done.json").exists():
        return
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    build = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
             "threads": torch.get_num_threads(), "pinned": os.environ.get("MUTUAL_RL_PINNED_WORKER") == "1",
             "via": "scripts/warmup_curve.py"}
    info = {**key, "final_loss": losses[-1], "quality": report, "build": build, "seconds": round(seconds, 1)}
    (tmp / "done.json").write_text(json.dumps(info, indent=1, default=str))
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
