"""The GPU path, in the order ``scripts/gpu_check.sh`` runs it (marked ``gpu``; skipped without a CUDA GPU):

1. a training step on the GPU (no FSDP) that touches every tensor path: rollouts, SGT's NLL term and peer rows
   (THL crossing, the residual metric), KL to the reference, LoRA and full weights, held-out evaluation (sampled
   and greedy);
2. the same under ``precision: bf16-mixed``: the weights stay float32 (master weights) and move;
3. one ``MutualFSDPStrategy`` step on one GPU (bf16 compute, float32 shards);
4. the HF rollout engine on the GPU: its sampled log-probs are the trainer's.

``MUTUAL_RL_GPU_TESTS_ON_CPU=1`` runs them on the CPU (bf16-mixed and FSDP on the CPU's own paths) to check the
tests themselves where no GPU is lent."""

from __future__ import annotations

import math
import os

import lightning.pytorch as pl
import pytest
import torch

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.evaluation.validation import EvalConfig
from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import SamplingSpec
from mutual_rl.module import MutualRLModule
from mutual_rl.types import Problem
from mutual_rl.update.config import GRPOConfig
from tests.module.helpers import TASK, RecordMetrics, datamodule, spec

ON_CPU = os.environ.get("MUTUAL_RL_GPU_TESTS_ON_CPU") == "1"
ACCELERATOR = "cpu" if ON_CPU else "gpu"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (torch.cuda.is_available() or ON_CPU),
                                                  reason="needs a CUDA GPU (MUTUAL_RL_GPU_TESTS_ON_CPU=1: on the CPU)")]


def _fit(tmp_path, **trainer_kw) -> tuple[MutualRLModule, RecordMetrics, dict]:
    specs = [spec("gpt2", "tiny:gpt2-bpe", lora=True), spec("llama", "tiny:llama-char")]
    m = MutualRLModule(specs, algorithm=GRPOConfig(num_mini_batches=2, kl_coef=1e-3), regime="sgt",
                       reward="test_parity", evaluation=EvalConfig(k=2, max_new_tokens=5, greedy=True),
                       log_samples_every_n_steps=0, thl_residual_every_n_steps=1)
    rec = RecordMetrics()
    start: dict = {}

    class Snapshot(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            # where the policies train (Lightning moves the module back to the CPU when fit ends)
            start["_devices"] = {n: p.device.type for n, p in pl_module.policies.items()}
            start.update({f"{n}.{k}": v.detach().float().cpu().clone() for n, p in pl_module.policies.items()
                          for k, v in p.model.named_parameters() if v.requires_grad})

    trainer = pl.Trainer(accelerator=ACCELERATOR, devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=1, val_check_interval=2, default_root_dir=str(tmp_path),
                         callbacks=[rec, Snapshot()], **trainer_kw)
    trainer.fit(m, datamodule())
    rec.rows.append({k: float(v) for k, v in trainer.callback_metrics.items()})  # with the validation at the end
    return m, rec, start


def _moved(m: MutualRLModule, start: dict) -> float:
    now = {f"{n}.{k}": v.detach().float().cpu() for n, p in m.policies.items()
           for k, v in p.model.named_parameters() if v.requires_grad}
    start = {k: v for k, v in start.items() if k != "_devices"}
    assert set(now) == set(start)
    return max(float((now[k] - start[k]).abs().max()) for k in now)


def test_training_step_on_the_gpu(tmp_path):
    m, rec, start = _fit(tmp_path)
    want = "cpu" if ON_CPU else "cuda"
    assert start.pop("_devices") == {n: want for n in m.policies}
    for policy in m.policies.values():
        assert policy.version > 0
    assert _moved(m, start) > 1e-4
    last = rec.rows[-1]
    assert "gpt2/val/pass@1" in last and "llama/val/pass@1" in last  # evaluation ran on the device
    assert all(math.isfinite(v) for k, v in last.items() if k.endswith(("/loss", "/grad_norm")))


def test_bf16_mixed_keeps_float32_master_weights(tmp_path):
    m, _, start = _fit(tmp_path, precision="bf16-mixed")
    for policy in m.policies.values():
        assert all(p.dtype == torch.float32 for p in policy.model.parameters())
    assert _moved(m, start) > 1e-4  # updates of lr 1e-3 land in float32, none rounds away


def test_one_fsdp_step(tmp_path):
    from mutual_rl.strategies import MutualFSDPStrategy

    m, _, start = _fit(tmp_path, strategy=MutualFSDPStrategy(mixed_precision="bf16"))
    assert _moved(m, start) > 1e-4
    assert all(p.version > 0 for p in m.policies.values())


def test_hf_engine_on_the_gpu():
    from mutual_rl.rollout import HFRolloutEngine

    device = torch.device("cpu") if ON_CPU else torch.device("cuda", torch.cuda.current_device())
    policy = build_policy(spec("p", "tiny:gpt2-bpe"), task=ArithmeticTask(**TASK)).to(device)
    problems = [Problem(1, "3+4=", "7", "add"), Problem(2, "12+34=", "46", "add")]
    torch.manual_seed(0)
    groups = HFRolloutEngine().generate(policy, problems, SamplingSpec(n=4, temperature=0.7, max_new_tokens=6), step=0)
    worst = 0.0
    for r in (r for g in groups for r in g):
        ids = torch.cat([r.prompt_ids, r.response_ids]).unsqueeze(0).to(device)
        with torch.no_grad():
            want, _ = policy.response_logp(ids, torch.ones_like(ids), len(r.response_ids), 0.7)
        worst = max(worst, float((r.logp - want[0].cpu()).abs().max()))
    assert worst <= 1e-4, worst
