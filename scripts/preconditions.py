"""The papers' preconditions for a pair of built presets, at the evaluation and at the rollout temperature: each
policy's held-out pass@1 (overall and per skill) and, for each direction A->B, the share of A's all-fail prompts
(no correct sample of k = 8) that B solves, and how often B's group there is mixed or all-pass.

Usage (preset folders from the cache, ``$MUTUAL_RL_CACHE/presets/<name>-<hash>``, or the shipped ones in
``src/mutual_rl/presets/shipped/``)::

    python scripts/preconditions.py gpt2=<folder> llama=<folder> --temperatures 0.6 1.0
    python scripts/preconditions.py gpt2=<folder> llama=<folder> --task chain      # benchmark v4's task
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from mutual_rl.data.chain import ChainTask
from mutual_rl.data.task import ArithmeticTask
from mutual_rl.evaluation.benchmarks import evaluate_problems
from mutual_rl.presets.quality import BuildPolicy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("policies", nargs="+", help="name=preset_folder")
    ap.add_argument("--temperatures", nargs="+", type=float, default=[0.6, 1.0])
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--task", choices=["arithmetic", "chain"], default="arithmetic",
                    help="arithmetic: benchmark v3's task; chain: v4's worked solutions (ChainTask, 3 terms)")
    args = ap.parse_args()
    task = (ArithmeticTask(operators=["+", "-"], digits=2, num_heldout=400) if args.task == "arithmetic"
            else ChainTask(num_heldout=400))
    max_new_tokens = 8 if args.task == "arithmetic" else 40
    problems = task.heldout_problems()
    policies = []
    for item in args.policies:
        name, eq, folder = item.partition("=")
        if not (name and eq and folder):
            ap.error(f"{item!r}: give each policy as NAME=PRESET_FOLDER, e.g. gpt2=$MUTUAL_RL_CACHE/presets/<name>-<hash>")
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        tok = PreTrainedTokenizerFast.from_pretrained(folder)
        tok.padding_side = "left"
        policies.append(BuildPolicy(name, model, tok, "{problem}", False, max_new_tokens))
    for t in args.temperatures:
        results, comp = evaluate_problems(policies, problems, reward=task.default_reward, k=args.k, temperature=t,
                                          top_p=0.95 if t < 1.0 else 1.0, max_new_tokens=max_new_tokens, seed=1234,
                                          progress=False)
        print(f"T = {t}:")
        for p in policies:
            m = results[p.name]
            skills = " ".join(f"{s} {100 * m[f'pass@1/{s}']:.1f}" for s in ("add", "sub"))
            print(f"  {p.name}: pass@1 {100 * m['pass@1']:.1f} % ({skills}); greedy {100 * m['greedy']:.1f} %")
        for key in sorted(k for k in comp if k.count("/") == 1):
            print(f"  {key}: share {100 * comp[key]:.0f} %, all-fail {comp[key + '/all_fail']:.0f}, mixed "
                  f"{100 * comp[key + '/mixed_frac']:.0f} %, all-pass {100 * comp[key + '/all_pass_frac']:.0f} %")


if __name__ == "__main__":
    main()
