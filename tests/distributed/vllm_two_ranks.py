"""Run under torchrun (2 CPU ranks, gloo) with vLLM installed: every rank builds its own in-process vLLM engines for
FSDP-sharded policies (gpt2 with LoRA, llama full) the way several GPUs would (``external_launcher``, per-rank
seeds), samples, pushes an update streamed unit by unit and verifies it; then a sync that fails on rank 1 only
must stop both ranks (rank 0 with a pointer to rank 1's error) instead of leaving rank 0 waiting. Closing the engines
leaves the trainer's process group working, and new engines build on it.
Writes OUT/rank<r>.json. Usage: torchrun --nproc-per-node 2 vllm_two_ranks.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mutual_rl.data.task import ArithmeticTask  # noqa: E402
from mutual_rl.model.policy import build_policy  # noqa: E402
from mutual_rl.model.spec import SamplingSpec  # noqa: E402
from mutual_rl.rollout import vllm as V  # noqa: E402
from mutual_rl.stats import flatten  # noqa: E402
from mutual_rl.strategies import shard_model  # noqa: E402
from mutual_rl.types import Problem  # noqa: E402
from tests.module.helpers import TASK, spec  # noqa: E402

PROBLEMS = [Problem(1, "3+4=", "7", "add"), Problem(2, "12+34=", "46", "add")]
SAMPLING = SamplingSpec(n=4, temperature=1.0, max_new_tokens=6)


def trainer_gap(policy, groups) -> float:
    worst = 0.0
    for r in (r for g in groups for r in g):
        ids = torch.cat([r.prompt_ids, r.response_ids]).unsqueeze(0)
        want, _ = policy.response_logp(ids, torch.ones_like(ids), len(r.response_ids), 1.0)
        worst = max(worst, float((r.logp - want[0].detach().cpu()).abs().max()))
    return worst


def main(out: str) -> None:
    import faulthandler

    faulthandler.dump_traceback_later(240, exit=True)  # a rank left waiting: show where, then fail
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    task = ArithmeticTask(**TASK)
    engine = V.VLLMRolloutEngine(enforce_eager=True, kv_cache_memory_bytes=32 * 2**20)
    result: dict = {}
    policies = {}
    for name, model, lora in (("gpt2", "tiny:gpt2-bpe", True), ("llama", "tiny:llama-char", False)):
        torch.manual_seed(0)  # the same initial weights on every rank, as seed_everything gives a fit
        policy = build_policy(spec(name, model, lora=lora), task=task)
        if lora:
            g = torch.Generator().manual_seed(1)
            with torch.no_grad():
                for n, p in policy.model.named_parameters():
                    if "lora_B" in n:
                        p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        layers = {type(m) for m in policy.model.modules() if type(m).__name__ in ("GPT2Block", "LlamaDecoderLayer")}
        policy.model = shard_model(policy.model, layers, torch.device("cpu"))
        policies[name] = policy
        torch.manual_seed(100 + rank)  # each rank its own sampling stream (the module offsets them per rank)
        groups = engine.generate(policy, PROBLEMS, SAMPLING, step=0)
        sampled_gap = trainer_gap(policy, groups)
        config = engine.llms[name].llm.llm_engine.vllm_config
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for p in policy.model.parameters():
                if p.requires_grad:
                    p.add_(torch.randn(p.shape, generator=g) * 0.02)  # each rank its shard
        policy.version += 1
        try:
            engine.probe(policy)
            stale_caught = False
        except V.WeightSyncError:
            stale_caught = True
        sync = engine.sync_weights(policy)
        result[name] = {
            "seed": config.model_config.seed, "backend": config.parallel_config.distributed_executor_backend,
            "texts": [r.response_text for g_ in groups for r in g_], "sampled_gap": sampled_gap,
            "stale_caught": stale_caught, **flatten(sync),
            "synced_gap": trainer_gap(policy, engine.generate(policy, PROBLEMS, SAMPLING, step=1)),
        }
    # a sync that loads nothing on rank 1 only: rank 1 raises its WeightSyncError, rank 0 stops too
    policy = policies["llama"]
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.05)
    policy.version += 1
    push_weights = V.push_weights
    if rank == 1:
        V.push_weights = lambda llm, weights: [w for w in weights] and []  # consumes the stream, loads nothing
    try:
        engine.sync_weights(policy)
        result["failure"] = "none"
    except (V.WeightSyncError, RuntimeError) as e:
        result["failure"] = f"{type(e).__name__}: {e}"
    V.push_weights = push_weights
    engine.close()  # vLLM's own teardown used to destroy the default (the trainer's) process group here
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    result["after_close"] = {"initialized": dist.is_initialized(), "all_reduce": total.item()}
    rebuilt = V.VLLMRolloutEngine(enforce_eager=True, kv_cache_memory_bytes=32 * 2**20)
    result["after_close"]["rebuilt_gap"] = trainer_gap(policies["gpt2"], rebuilt.generate(policies["gpt2"], PROBLEMS,
                                                                                          SAMPLING, step=2))
    rebuilt.close()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
