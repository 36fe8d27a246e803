"""DAPO dynamic sampling on two CPU ranks (gloo) under ``MutualFSDPStrategy``: the ranks need different numbers of
extra rounds, the full one takes part in the other's ``generate`` passes (no hang), and each rank trains on exactly
``batch_size`` mixed groups with group ids unique across ranks."""

from __future__ import annotations

import sys

import pytest
import yaml

from mutual_rl.exchange.store import read_step
from mutual_rl.step.dynamic import EXTRA_GROUP_IDS
from tests.distributed.test_fsdp_cpu import _free_port, _run, presets  # noqa: F401 (fixture)
from tests.module.helpers import TASK

pytestmark = pytest.mark.slow  # a two-rank torchrun fit


def test_two_rank_dynamic_sampling_fit(presets, tmp_path):  # noqa: F811
    max_rounds, batch = 6, 2
    cfg = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu", "devices": 2, "max_steps": 3, "enable_progress_bar": False, "logger": False,
            "enable_model_summary": False, "num_sanity_val_steps": 0, "limit_val_batches": 0,
            "enable_checkpointing": False, "default_root_dir": str(tmp_path),
            "strategy": {"class_path": "mutual_rl.strategies.MutualFSDPStrategy"},
            "callbacks": [{"class_path": "mutual_rl.exchange.ExperienceExchange",
                           "init_args": {"store_dir": str(tmp_path / "traffic")}}],
        },
        "model": {"policies": [{"name": "p", "model": "tiny:gpt2-bpe", "optimizer": {"lr": 1e-3},
                                "sampling": {"n": 4, "max_new_tokens": 5}, "warmstart": {"steps": 20}}],
                  "regime": "none", "reward": "tests.distributed.ds_reward:by_answer", "eval_at_start": False,
                  "algorithm": {"num_mini_batches": 2, "dynamic_sampling": True,
                                "dynamic_sampling_max_rounds": max_rounds},
                  "export_dir": str(tmp_path / "export")},
        "data": {"task": dict(TASK), "batch_size": batch},
    }
    path = tmp_path / "fit.yaml"
    path.write_text(yaml.safe_dump(cfg))
    _run([sys.executable, "-m", "mutual_rl.cli", "fit", "--config", str(path)], timeout=600,
         MASTER_PORT=str(_free_port()))
    extra_ranks = set()
    for step in range(3):
        records = [r for r in read_step(tmp_path / "traffic", step).records if type(r).__name__ == "Rollout"]
        groups = {(r.prompt_id, r.group_id) for r in records}
        assert len(groups) == 2 * batch and len(records) == 2 * batch * 4, (step, groups)  # both ranks full
        for _, gid in groups:
            if gid >= EXTRA_GROUP_IDS:  # (step * world + rank) in the id tells which rank sampled extra prompts
                extra_ranks.add((step, (gid - EXTRA_GROUP_IDS) // (max_rounds * batch) - 2 * step))
    per_step = {}
    for step, rank in extra_ranks:
        per_step.setdefault(step, set()).add(rank)
    assert any(len(r) == 1 for r in per_step.values()), per_step  # some step: one rank sampled more, the other waited
    assert (tmp_path / "export" / "p" / "config.json").exists()
