"""Two CPU ranks (gloo) with real FSDP: the sharded update equals the one-process update on the union of the ranks'
rows, and ``mutual-rl fit`` with ``MutualFSDPStrategy`` (activation checkpointing on; a LoRA policy and a full one,
KL on) trains on per-rank prompts (GRAFT, whose data-dependent forward counts differ between ranks), evaluates each
held-out problem once, stores every rank's traffic, checkpoints each rank's sampling stream, resumes, and exports
both policies."""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.exchange.store import read_step
from mutual_rl.model.policy import build_policy
from tests.module.helpers import TASK, pair, spec

pytestmark = pytest.mark.slow  # two torchrun processes per test

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], timeout: int, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **env}
    proc = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


@pytest.fixture(scope="module")
def presets():
    """Build the presets once here, so the ranks never build them concurrently."""
    task = ArithmeticTask(**TASK)
    for s in [spec("p", "tiny:gpt2-bpe"), *pair()]:
        build_policy(s, task=task)


@pytest.mark.parametrize("mini, micro, nll, agg", [(2, 3, 1, "token-mean"), (1, 0, 0, "token-mean"),
                                                   (2, 3, 0, "seq-mean-token-sum-norm")],
                         ids=["micro3-nll", "whole", "seq-mean"])
def test_sharded_update_equals_union_update(presets, tmp_path, mini, micro, nll, agg):
    out = tmp_path / "eq.json"
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port()),
          str(HERE / "fsdp_update_equivalence.py"), str(out)], timeout=300,
         EQ_MINI=str(mini), EQ_MICRO=str(micro), EQ_NLL=str(nll), EQ_AGG=agg)
    r = json.loads(out.read_text())
    assert r["active_rows_per_rank"][0] != r["active_rows_per_rank"][1]  # the lockstep padding was exercised
    assert r["version"] == mini
    assert r["max_change"] > 1e-2  # the update moved the weights ...
    assert r["max_diff"] < 1e-5  # ... as the one-process update on the union of the ranks' rows (float rounding:
    # 1.2e-7 token-mean, 1.3e-6 seq-mean-token-sum-norm, against changes of 3e-2 to 6e-2)


def test_vllm_weight_stream_gathers_one_unit_at_a_time(presets, tmp_path):
    """The stream a vLLM sync loads (rollout.vllm_sync.hf_weights) of sharded policies (gpt2 + LoRA, llama full)
    equals the unsharded policies' weights exactly, with at most one FSDP unit gathered whenever it yields."""
    out = tmp_path / "stream.json"
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port()),
          str(HERE / "fsdp_stream_weights.py"), str(out)], timeout=300)
    for name, r in json.loads(out.read_text()).items():
        assert r["same_names"] and r["tensors"] > 30, (name, r)
        assert r["max_diff"] == 0.0, (name, r)  # LoRA merged per unit as in one process
        assert r["units"] == 5 and r["most_units_full_at_once"] == 1, (name, r)  # the root, then 4 decoder layers
        assert r["max_local_numel_while_streaming"] < 0.7 * r["model_numel"], (name, r)  # never a whole-model gather


def test_two_rank_fsdp_fit(presets, tmp_path):
    specs = pair()
    policies = [{"name": s.name, "model": s.model, "optimizer": {"lr": 1e-3},
                 "sampling": {"n": 4, "max_new_tokens": 5}, "warmstart": {"steps": 20}} for s in specs]
    policies[0]["lora"] = {"r": 4, "alpha": 8}  # gpt2 trains LoRA adapters (KL reference: adapters disabled)
    cfg = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu", "devices": 2, "max_steps": 2, "enable_progress_bar": False,
            "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                       "init_args": {"save_dir": str(tmp_path), "name": "csv", "version": 0}},
            "enable_model_summary": False, "num_sanity_val_steps": 0,
            "default_root_dir": str(tmp_path),
            "strategy": {"class_path": "mutual_rl.strategies.MutualFSDPStrategy",
                         "init_args": {"activation_checkpointing": True}},
            "callbacks": [
                {"class_path": "mutual_rl.exchange.ExperienceExchange",
                 "init_args": {"store_dir": str(tmp_path / "traffic")}},
                {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                 "init_args": {"dirpath": str(tmp_path / "ckpt"), "save_last": True}},
            ],
        },
        "model": {"policies": policies, "regime": {"class_path": "GRAFT", "init_args": {"delta": 0.0}},
                  "reward": "tests.distributed.cli_reward:parity",
                  "algorithm": {"num_mini_batches": 2, "micro_batch_size": 3, "kl_coef": 0.01},
                  "evaluation": {"k": 2, "max_new_tokens": 5}, "export_dir": str(tmp_path / "export")},
        "data": {"task": {k: v for k, v in TASK.items()}, "batch_size": 2, "val_batch_size": 3,
                 "val_per_skill": 4},
    }
    path = tmp_path / "fit.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = _run([sys.executable, "-m", "mutual_rl.cli", "fit", "--config", str(path)], timeout=600,
                MASTER_PORT=str(_free_port()))
    log = proc.stdout + proc.stderr
    # per-rank prompts, nothing lost: each step file holds both ranks' groups (2 ranks x 2 prompts x n=4 each)
    for step in (0, 1):
        records = [r for r in read_step(tmp_path / "traffic", step).records if type(r).__name__ == "Rollout"]
        for name in ("gpt2", "llama"):
            mine = [r for r in records if r.policy_id == name]
            assert len(mine) == 2 * 2 * 4, (step, name, len(mine))
            assert len({r.prompt_id for r in mine}) == 4  # the ranks trained on different prompts
            assert len({r.group_id for r in mine}) == 4  # group ids unique across ranks
    # held-out evaluation at step 0, sharded over the ranks: every problem counted once (4 per skill x 2 skills)
    rows = list(csv.DictReader(open(tmp_path / "csv" / "version_0" / "metrics.csv")))
    at0 = {k: v for r in rows if r.get("step") == "0" for k, v in r.items() if v != ""}
    for name in ("gpt2", "llama"):
        assert float(at0[f"{name}/val/num_problems"]) == 8.0, sorted(at0)[:20]
        assert 0.0 <= float(at0[f"{name}/val/pass@1"]) <= 1.0
    ckpt = torch.load(tmp_path / "ckpt" / "last.ckpt", map_location="cpu", weights_only=False)
    streams = ckpt["mutual_rl"]["rng_per_rank"]
    assert len(streams) == 2 and not torch.equal(streams[0]["torch"], streams[1]["torch"])
    for r in rows:  # exchange counts are global totals: every flow still adds up over the ranks
        for flow in ("gpt2->llama", "llama->gpt2"):
            if r.get(f"exchange/{flow}/delivered"):
                dropped = sum(float(v) for k, v in r.items() if k.startswith(f"exchange/{flow}/dropped/") and v)
                assert float(r[f"exchange/{flow}/consumed"]) + dropped == float(r[f"exchange/{flow}/delivered"])
                assert float(r[f"exchange/{flow}/delivered"]) == 2 * 2 * 4  # both ranks' peer responses
    trained = [r for r in rows if r.get("gpt2/grad_norm")]
    assert len(trained) == 2 and all(float(r["gpt2/grad_norm"]) > 0 and float(r["llama/grad_norm"]) > 0
                                     for r in trained)
    # exported from the gathered shards under the plain Hugging Face names: llama whole, gpt2's LoRA adapters
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path / "export" / "llama", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], (info, log[-2000:])
    adapters = load_file(tmp_path / "export" / "gpt2" / "adapter_model.safetensors")
    assert len(adapters) == 2 * 4 * 4 and all("lora_" in k and "_fsdp" not in k and v.numel() > 0
                                              for k, v in adapters.items())
    assert any(float(v.abs().max()) > 0 for k, v in adapters.items() if "lora_B" in k)  # trained (B starts at 0)
    # the full checkpoint holds each optimizer's whole state keyed by parameter id, as a plain optimizer's
    saved = [_adam_steps(o) for o in ckpt["optimizer_states"]]
    assert len(saved) == 2 and all(s > 0 for s in saved)
    assert all(isinstance(k, int) for o in ckpt["optimizer_states"] for k in o["state"])
    # resume on two ranks from the full checkpoint (model, optimizers, data position, per-rank streams)
    _run([sys.executable, "-m", "mutual_rl.cli", "fit", "--config", str(path), "--trainer.max_steps", "3",
          "--ckpt_path", str(tmp_path / "ckpt" / "last.ckpt")], timeout=600, MASTER_PORT=str(_free_port()))
    # the optimizers went on counting from the loaded state (a fresh one would count step 3's updates only)
    after = torch.load(tmp_path / "ckpt" / "last.ckpt", map_location="cpu", weights_only=False)
    resumed_steps = [_adam_steps(o) for o in after["optimizer_states"]]
    assert all(a > s for a, s in zip(resumed_steps, saved)), (saved, resumed_steps)
    resumed = [r for r in read_step(tmp_path / "traffic", 2).records if type(r).__name__ == "Rollout"]
    earlier = {r.prompt_id for s in (0, 1) for r in read_step(tmp_path / "traffic", s).records
               if hasattr(r, "prompt_id")}
    assert len(resumed) == 2 * 2 * 2 * 4 and not {r.prompt_id for r in resumed} & earlier  # the next, unseen batch


def _adam_steps(state: dict) -> float:
    """The most AdamW steps any parameter of one saved optimizer state has taken."""
    return max(float(p["step"]) for p in state["state"].values())


def test_an_accounting_error_on_one_rank_stops_every_rank(tmp_path):
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port()),
          str(HERE / "exchange_fail_together.py"), str(tmp_path)], timeout=120)
    assert "never reported" in (tmp_path / "rank0.txt").read_text()
    assert "on another rank" in (tmp_path / "rank1.txt").read_text()
