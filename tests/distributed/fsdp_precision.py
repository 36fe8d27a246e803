"""Run under torchrun (2 CPU ranks, gloo): FSDP precision and the chunked output head under FSDP. Writes a JSON
summary (rank 0). Usage: torchrun --nproc-per-node 2 fsdp_precision.py OUT.json

``precision``: a 2-layer Qwen2-architecture model built from config with random weights (rotary base 1e6, head
dim 128; its query/key and head weights scaled up so that attention, and so the log-probs, depend on positions)
scores one 3,000-token sequence through the policy (``Policy.response_logp``, chunked head): unsharded in float32,
unsharded under bf16 autocast (Lightning's bf16-mixed), sharded with ``mixed_precision: bf16`` as
``MutualFSDPStrategy`` builds it (bf16 compute, float32 buffers and reduction), and sharded with the old setting
(buffers in bf16 too). Also the dtype of the rotary ``inv_freq`` the sharded forward uses, and the dtype the
sharded gradient is reduced in.

``head``: a 151,936-token vocabulary policy (Qwen2 architecture, tied embeddings, 2 small layers) sharded on two
ranks; one GRPO update (old log-probs recomputed, then forward/backward) with the chunked head and with full
logits, each rank on its own rows; the peak resident memory of each update (VmHWM reset before it, with
``MALLOC_MMAP_THRESHOLD_`` fixed so freed tensors leave the resident set) and its loss and gradient norm.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mutual_rl.model.policy import Policy  # noqa: E402
from mutual_rl.model.spec import PolicySpec, SamplingSpec  # noqa: E402
from mutual_rl.strategies import _mixed_precision, shard_model, shard_reference  # noqa: E402
from mutual_rl.types import PolicyBatch, TrainingPlan  # noqa: E402
from mutual_rl.update.config import GRPOConfig  # noqa: E402
from mutual_rl.update.loop import update_policy  # noqa: E402

SEQ = 3000


def _model(vocab: int, hidden: int, heads: int, inter: int, tied: bool, seed: int):
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2,
                      num_attention_heads=heads, num_key_value_heads=1, max_position_embeddings=4096,
                      rope_theta=1e6, tie_word_embeddings=tied, attn_implementation="sdpa")
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).float()


def _policy(model, max_new_tokens: int = 8) -> Policy:
    spec = PolicySpec(name="p", model="tiny:llama-char", sampling=SamplingSpec(n=2, max_new_tokens=max_new_tokens))
    policy = Policy(spec, model, tokenizer=None)
    policy.share_prompts = False
    return policy


def _layers(model):
    return {type(m) for m in model.modules() if type(m).__name__ == "Qwen2DecoderLayer"}


def precision() -> dict:
    from torch.distributed.fsdp import MixedPrecision

    model = _model(vocab=512, hidden=256, heads=2, inter=512, tied=False, seed=0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(6.0)  # sharp, position-dependent attention
            elif name.endswith("lm_head.weight"):
                p.mul_(4.0)  # log-probs that follow the hidden states
    inv_freq = model.model.rotary_emb.inv_freq
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 512, (1, SEQ), generator=g)
    mask = torch.ones_like(ids)

    def score(policy, autocast: bool) -> torch.Tensor:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return policy.response_logp(ids, mask, SEQ - 1, 1.0)[0][0].float()

    fp32 = score(_policy(copy.deepcopy(model)), autocast=False)
    mixed = score(_policy(copy.deepcopy(model)), autocast=True)
    out = {"inv_freq_min": float(inv_freq.min()), "head_dim": 2 * len(inv_freq)}
    for label, mp in (("fsdp_bf16", _mixed_precision("bf16")),
                      ("fsdp_bf16_buffers", MixedPrecision(torch.bfloat16, torch.bfloat16, torch.bfloat16))):
        policy = _policy(copy.deepcopy(model))
        policy.model = shard_model(policy.model, _layers(policy.model), torch.device("cpu"), mixed_precision=mp)
        seen = []
        rotary = policy.model.module.model.rotary_emb
        rotary.register_forward_pre_hook(lambda m, _args, seen=seen: seen.append(str(m.inv_freq.dtype)))
        got = score(policy, autocast=True)
        out[label] = {"inv_freq_dtype": seen[0], "mean_vs_mixed": float((got - mixed).abs().mean()),
                      "tail_mean_vs_mixed": float((got - mixed)[2000:].abs().mean()),
                      "head_mean_vs_mixed": float((got - mixed)[:500].abs().mean()),
                      "reduce_dtype": str(mp.reduce_dtype)}
    out["reference"] = reference(model, ids[:, :400])
    out["mixed_vs_fp32"] = {"mean": float((mixed - fp32).abs().mean()),
                            "tail_mean": float((mixed - fp32)[2000:].abs().mean())}
    return out


def reference(model, ids: torch.Tensor) -> dict:
    """The KL reference as ``MutualFSDPStrategy`` shards it (``shard_reference``) beside the policy sharded with
    ``mixed_precision: bf16``: its shard's dtype and bytes, and its log-probs against the policy's at step 0."""
    policy = Policy(_policy(model).spec, copy.deepcopy(model), tokenizer=None, needs_reference=True)
    policy.share_prompts = False
    mp = _mixed_precision("bf16")
    policy.model = shard_model(policy.model, _layers(policy.model), torch.device("cpu"), mixed_precision=mp)
    ref = policy._reference[0]
    policy._reference[0] = shard_reference(ref, _layers(ref), torch.device("cpu"), mixed_precision=mp)
    mask = torch.ones_like(ids)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        mine = policy.response_logp(ids, mask, ids.shape[1] - 1, 1.0)[0]
        theirs = policy.response_logp(ids, mask, ids.shape[1] - 1, 1.0, reference=True)[0]
    shard = [q for q in policy._reference[0].parameters()]
    return {"dtypes": sorted({str(q.dtype) for q in shard}), "shard_bytes": sum(q.numel() * q.element_size()
            for q in shard), "full_fp32_bytes": 4 * sum(q.numel() for q in model.parameters()),
            "max_diff": float((mine - theirs).abs().max()), "requires_grad": any(q.requires_grad for q in shard),
            "world": dist.get_world_size()}


def _vm(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def head() -> dict:
    rank = dist.get_rank()
    base = _model(vocab=151936, hidden=64, heads=2, inter=128, tied=True, seed=0)
    b, p, t = 4, 8, 100
    g = torch.Generator().manual_seed(10 + rank)  # each rank its own rows
    ids = torch.randint(0, 151936, (b, p + t), generator=g)
    attn = torch.ones_like(ids)
    lengths = torch.tensor([t, t - 7, t - 30, t - 55])
    resp = (torch.arange(t)[None] < lengths[:, None]).float()
    attn[:, p:] = resp.long()
    batch = PolicyBatch(input_ids=ids, attention_mask=attn, response_mask=resp, old_logp=torch.zeros(b, t),
                        advantages=torch.tensor([1.0, -0.5, 0.25, -1.0]), weights=torch.ones(b),
                        is_peer=torch.zeros(b, dtype=torch.bool), prompt_ids=list(range(b)))
    cfg = GRPOConfig(num_mini_batches=1, micro_batch_size=0, old_logp="recompute", skip_zero_advantage=False)
    out = {}
    for label, chunked in (("chunked", True), ("full", False)):
        policy = _policy(copy.deepcopy(base), max_new_tokens=t)
        policy.chunked_head = chunked
        policy.model = shard_model(policy.model, _layers(policy.model), torch.device("cpu"))
        opt = torch.optim.SGD([q for q in policy.parameters() if q.requires_grad], lr=0.0)
        plan = TrainingPlan(batch, [list(range(b))])
        dist.barrier()
        before = _vm("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # reset the resident-set high-water mark
        stats = update_policy(policy, plan, cfg, backward=lambda loss: loss.backward(), step_optimizer=opt.step,
                              zero_grad=lambda o=opt: o.zero_grad(set_to_none=True))
        peak = _vm("VmHWM") - before
        out[label] = {"peak_bytes": peak, "loss": stats.loss, "grad_norm": float(stats.grad_norm)}
        del policy, opt
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, out)
    return {"per_rank": gathered}


def main(out: str) -> None:
    import faulthandler

    faulthandler.dump_traceback_later(400, exit=True)
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    result = {"precision": precision(), "head": head()}
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
