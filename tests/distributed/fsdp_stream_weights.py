"""Run under torchrun (2 CPU ranks, gloo): the vLLM weight stream (``rollout.vllm_sync.hf_weights``) of FSDP-sharded
policies -- gpt2 with LoRA adapters and llama with full weights -- equals the unsharded policies' Hugging Face
weights (LoRA merged), and gathers one FSDP unit at a time: whenever it yields a tensor, at most one unit of the
model holds full parameters. Writes a JSON summary (rank 0). Usage: torchrun --nproc-per-node 2
fsdp_stream_weights.py OUT.json
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mutual_rl.data.task import ArithmeticTask  # noqa: E402
from mutual_rl.model.policy import build_policy  # noqa: E402
from mutual_rl.rollout.vllm_sync import _walk, hf_weights  # noqa: E402
from mutual_rl.strategies import clean_name, shard_model  # noqa: E402
from tests.module.helpers import TASK, spec  # noqa: E402


def unit_params(model) -> list[list[tuple[str, torch.nn.Parameter]]]:
    """Per FSDP unit (the root first): the (plain name, parameter) pairs it owns directly, not its nested units'."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    units = [(n, m) for n, m in model.named_modules() if isinstance(m, FSDP)]
    stop = {id(u) for _, u in units}
    return [[(clean_name(f"{n}.{mod_name}.{pn}" if mod_name else f"{n}.{pn}").strip("."), p)
             for mod_name, mod in _walk(u, "", stop - {id(u)}) for pn, p in mod.named_parameters(recurse=False)]
            for n, u in units]


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    task = ArithmeticTask(**TASK)
    summary = {}
    for name, model_name, lora in (("gpt2", "tiny:gpt2-bpe", True), ("llama", "tiny:llama-char", False)):
        torch.manual_seed(0)  # the same LoRA initialisation on every rank (as seed_everything gives a fit)
        policy = build_policy(spec(name, model_name, lora=lora), task=task)
        if lora:  # peft initialises B = 0; make the merge matter (same values on every rank)
            g = torch.Generator().manual_seed(1)
            with torch.no_grad():
                for n, p in policy.model.named_parameters():
                    if "lora_B" in n:
                        p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        reference = {k: v.clone() for k, v in hf_weights(copy.deepcopy(policy))}  # unsharded: the plain stream
        full_numel = {n: p.numel() for n, p in policy.model.named_parameters(remove_duplicate=False)}
        layers = {type(m) for m in policy.model.modules() if type(m).__name__ in ("GPT2Block", "LlamaDecoderLayer")}
        policy.model = shard_model(policy.model, layers, torch.device("cpu"))
        units = unit_params(policy.model)
        unit_full = [sum(full_numel[n] for n, _ in ps) for ps in units]
        streamed, most_full, max_local = {}, 0, 0
        for key, value in hf_weights(policy):
            gathered = sum(1 for ps, full in zip(units, unit_full) if ps and sum(p.numel() for _, p in ps) == full)
            most_full = max(most_full, gathered)
            max_local = max(max_local, sum(p.numel() for p in policy.model.parameters()))
            streamed[key] = value.clone()
        same = sorted(streamed) == sorted(reference)
        diff = max(float((streamed[k] - reference[k]).abs().max()) for k in reference) if same else float("inf")
        summary[name] = {"same_names": same, "max_diff": diff, "most_units_full_at_once": most_full,
                         "units": len(units), "max_local_numel_while_streaming": max_local,
                         "model_numel": sum(full_numel.values()), "tensors": len(streamed)}
    if rank == 0:
        Path(out).write_text(json.dumps(summary))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
