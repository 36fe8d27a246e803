"""Benchmark: peak memory of one policy update on a 151k-token vocabulary, chunked head vs full logits
(goal: chunked <= 0.5x).

What is measured
----------------
One update = ``Policy.response_logp`` over a batch of GRPO rows (``--rows`` responses of ``--response`` tokens after
a ``--prompt``-token prompt; 8 rows share each prompt, as a group does), the token-mean policy-gradient loss
``-Σ A·logp / tokens`` with random advantages, ``backward`` and ``AdamW.step``, taken ``--steps`` times (the first
creates the optimizer state). The model is the embedded ``tiny:qwen-vocab`` preset (a small Qwen2 on the Qwen BPE
vocabulary, 151,851 ids; built with no warm-up: memory does not depend on the weights), on this machine's CPU or on CUDA.

Two variants of the same update, each in a fresh subprocess:

* ``full``: the policy builds ``[rows, response, vocabulary]`` logits and their float32 log-softmax
  (``policy.chunked_head = False``; what the trainer did before, and what a plain Hugging Face forward does);
* ``chunked``: the head runs outside the model in chunks of tokens (``algorithms/token_logp.py``, the default).

Memory is the peak during the steps minus the memory just before them (model built, one small warm-up update
done and its gradients freed), measured as ``scripts/peak_memory.py`` says (CPU RSS, or CUDA's allocator peak).
Variants alternate for ``--reps`` runs each; the ratio is median(chunked) / median(full). The log-probs of both
variants are printed (their sums agree to float rounding).

Usage::

    python scripts/bench_logits_memory.py [--reps 3] [--rows 64 --prompt 16 --response 32] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from peak_memory import PeakMemory, memory_key, run_variants


def measure(args) -> dict:
    """Child process: build the preset, run the updates, report the peak memory delta (MiB)."""
    import torch

    from mutual_rl.model.policy import build_policy
    from mutual_rl.model.spec import PolicySpec, WarmStart

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = torch.device(args.device)
    policy = build_policy(PolicySpec(name="q", model="tiny:qwen-vocab", warmstart=WarmStart(steps=0))).to(dev)
    policy.chunked_head = args.variant == "chunked"
    vocab = policy.model.config.vocab_size
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-5)
    g = torch.Generator().manual_seed(0)
    groups = args.rows // 8
    prompts = torch.randint(0, vocab, (groups, args.prompt), generator=g).repeat_interleave(8, dim=0)
    ids = torch.cat([prompts, torch.randint(0, vocab, (args.rows, args.response), generator=g)], dim=1).to(dev)
    mask = torch.ones_like(ids)
    adv = torch.randn(args.rows, 1, generator=g).to(dev)

    def update(rows: int) -> float:
        logp, _ = policy.response_logp(ids[:rows], mask[:rows], args.response, 1.0, with_entropy=True)
        loss = -(adv[:rows] * logp).sum() / logp.numel()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(logp.detach().double().sum())

    update(8)  # warm-up: lazily loaded code, thread pools and the optimizer state go into the baseline
    t0 = time.perf_counter()
    with PeakMemory(dev) as mem:
        sums = [update(args.rows) for _ in range(args.steps)]
    secs = time.perf_counter() - t0
    out = {"variant": args.variant, "vocab": vocab, "params": sum(p.numel() for p in policy.parameters()),
           "seconds": secs, "rss_delta_mib": mem.rss_delta_mib, "logp_sums": sums}
    if mem.cuda_delta_mib is not None:
        out["cuda_delta_mib"] = mem.cuda_delta_mib
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="subprocess runs per variant, interleaved")
    ap.add_argument("--rows", type=int, default=64, help="responses per update (8 per prompt; default 64)")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens (default 16)")
    ap.add_argument("--response", type=int, default=32, help="response tokens (default 32)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default=None, help="cpu | cuda (default: cuda if available)")
    ap.add_argument("--variant", default=None, help=argparse.SUPPRESS)  # child mode
    args = ap.parse_args()
    if args.variant:
        print("RESULT " + json.dumps(measure(args)), flush=True)
        return
    if args.rows < 8 or args.rows % 8:
        raise SystemExit(f"--rows must be a positive multiple of 8 (groups of 8), got {args.rows}")
    key = memory_key(args)

    def show(variant, r):
        print(f"  {variant:7s}: peak delta {r[key]:8.1f} MiB ({r['seconds']:.2f}s; log-prob sums "
              f"{', '.join(f'{s:.4f}' for s in r['logp_sums'])})", flush=True)

    # the preset's build-time quality report samples thousands of completions over 151k logits: not measured here
    runs = run_variants(__file__, args, ("full", "chunked"), env={"MUTUAL_RL_PRESET_REPORT": "0"}, on_result=show)
    med = {v: statistics.median(r[key] for r in rs) for v, rs in runs.items()}
    sec = {v: statistics.median(r["seconds"] for r in rs) for v, rs in runs.items()}
    r0 = runs["full"][0]
    logits_mib = args.rows * args.response * r0["vocab"] * 4 / 2**20
    print(f"\nmodel: tiny:qwen-vocab, {r0['params'] / 1e6:.1f} M params, vocabulary {r0['vocab']}; {args.rows} rows "
          f"x ({args.prompt} prompt + {args.response} response) tokens; {args.steps} updates; device {args.device}; "
          f"full float32 logits alone: {logits_mib:.0f} MiB")
    print(f"median peak delta over {args.reps} runs: full {med['full']:.1f} MiB, chunked {med['chunked']:.1f} MiB; "
          f"time {sec['full']:.2f}s vs {sec['chunked']:.2f}s")
    print(f"chunked/full peak update memory ({key}): {med['chunked'] / med['full']:.3f} (goal <= 0.5)")


if __name__ == "__main__":
    main()
