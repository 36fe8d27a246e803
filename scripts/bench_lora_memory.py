"""Benchmark: peak memory of one LoRA training step vs one full fine-tuning step of the same model (goal <= 0.6x).

What is measured
----------------
One training step = forward + backward + ``AdamW.step`` on one batch (``--batch`` sequences of ``--seq`` random
tokens, causal-LM loss), taken ``--steps`` times (default 2: the first creates the optimizer state, the second
is the steady state). Two variants of the same model, built locally from a config (no download; a GPT-2 of width
512, 8 layers, vocab 8192: ~29 M parameters, so parameters, gradients and Adam state dominate):

* ``full``: every parameter trains;
* ``lora``: the project's LoRA wiring (``Policy`` with ``LoraSpec(r=8, alpha=16, target_modules="all-linear")``,
  peft), only the adapters train.

Each measurement runs in a fresh subprocess (allocator state and peak counters start clean). Memory is the
**peak during the steps minus the memory held just before them** (model built and, for LoRA, wrapped; one
forward/backward on a 1x8 batch with its gradients freed, so lazily loaded code and thread pools are in the
baseline, not in the delta):

* CPU: resident set size sampled every 0.2 ms by a thread (psutil), peak minus the RSS before the first step;
  ``ru_maxrss`` (process lifetime peak) is printed as a cross-check. Children run with glibc's
  ``MALLOC_MMAP_THRESHOLD_=65536`` (fixed, not dynamic), so freed tensors return to the OS and RSS tracks live
  memory instead of allocator caching;
* GPU (``--device cuda``, default when available): ``torch.cuda.max_memory_allocated`` minus
  ``memory_allocated`` before the first step.

Variants alternate (full, lora, lora, full, ...) for ``--reps`` runs each; the ratio is median(lora) /
median(full). The frozen base weights are in the baseline on both sides (they are needed either way).

Usage::

    python scripts/bench_lora_memory.py [--reps 3] [--width 512 --layers 8 --vocab 8192] [--batch 4 --seq 64]
        [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

from peak_memory import PeakMemory, memory_key, run_variants


def measure(args) -> dict:
    """Child process: build, wrap, run the steps, report peak memory deltas (MiB)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from mutual_rl.model.policy import Policy
    from mutual_rl.model.spec import LoraSpec, PolicySpec

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = torch.device(args.device)
    cfg = GPT2Config(vocab_size=args.vocab, n_positions=max(256, args.seq), n_embd=args.width, n_layer=args.layers,
                     n_head=max(1, args.width // 64), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM")
    model = GPT2LMHeadModel(cfg)
    spec = PolicySpec(name="p", model="local", lora=LoraSpec(r=8, alpha=16) if args.variant == "lora" else None)
    policy = Policy(spec, model, tokenizer=None).to(dev)
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=dev)
    n_all, n_train = sum(p.numel() for p in policy.parameters()), sum(p.numel() for p in params)
    tiny = ids[:1, :8]  # warm-up: load lazily imported code and thread pools into the baseline; grads freed
    policy.model(input_ids=tiny, labels=tiny).loss.backward()
    policy.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    with PeakMemory(dev) as mem:
        for _ in range(args.steps):
            loss = policy.model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    secs = time.perf_counter() - t0
    out = {"variant": args.variant, "params": n_all, "trainable": n_train, "seconds": secs,
           "rss_delta_mib": mem.rss_delta_mib,
           "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if mem.cuda_delta_mib is not None:
        out["cuda_delta_mib"] = mem.cuda_delta_mib
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="subprocess runs per variant, interleaved")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default=None, help="cpu | cuda (default: cuda if available)")
    ap.add_argument("--variant", default=None, help=argparse.SUPPRESS)  # child mode
    args = ap.parse_args()
    if args.variant:
        print("RESULT " + json.dumps(measure(args)), flush=True)
        return
    key = memory_key(args)

    def show(variant, r):
        print(f"  {variant:4s}: peak delta {r[key]:8.1f} MiB  (RSS delta {r['rss_delta_mib']:.1f}, lifetime "
              f"ru_maxrss {r['ru_maxrss_mib']:.1f} MiB; {r['seconds']:.2f}s)", flush=True)

    runs = run_variants(__file__, args, ("full", "lora"), on_result=show)
    full, lora = runs["full"][0], runs["lora"][0]
    med = {v: statistics.median(r[key] for r in rs) for v, rs in runs.items()}
    print(f"\nmodel: GPT-2 w{args.width} l{args.layers} vocab {args.vocab}: {full['params'] / 1e6:.2f} M params; "
          f"trainable full {full['trainable'] / 1e6:.2f} M, LoRA {lora['trainable'] / 1e6:.3f} M; batch "
          f"{args.batch}x{args.seq}; {args.steps} steps; device {args.device}")
    print(f"median peak delta over {args.reps} runs: full {med['full']:.1f} MiB, LoRA {med['lora']:.1f} MiB")
    print(f"LoRA/full peak training memory ({key}): {med['lora'] / med['full']:.3f} (goal <= 0.6)")


if __name__ == "__main__":
    main()
