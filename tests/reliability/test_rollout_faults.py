"""A rollout engine's fault mid-run (issue 37 item 5): an exception in ``generate`` or ``sync_weights`` at step k,
from a real engine (the HF engine with an injected fault, named by ``class_path``: ``failing_engines.py``), writes
``last.ckpt``, ends the run with one message naming the policy, the phase and the step (the ``mutual-rl`` command:
one paragraph, exit 1), and ``--ckpt_path last`` then reaches bit-exactly the weights and the logged values of a run
that had no fault."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from mutual_rl.cli import main
from mutual_rl.step.faults import RolloutFault
from tests.module.helpers import fit_command, subprocess_env
from tests.reliability.one_glance import one_glance, reported

N_STEPS = 3


@pytest.fixture(autouse=True)
def _no_pytest_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["mutual-rl"])


def _cfg(tmp_path: Path, name: str, fault: dict | None) -> Path:
    policies = [{"name": n, "model": m, "warmstart": {"steps": 20}, "sampling": {"n": 4, "max_new_tokens": 5},
                 "optimizer": {"lr": 1e-3}} for n, m in (("gpt2", "tiny:gpt2-bpe"), ("llama", "tiny:llama-char"))]
    model = {"policies": policies, "log_samples_every_n_steps": 0, "eval_at_start": False,
             "algorithm": {"num_mini_batches": 2}, "reward": "tests.reliability.failing_engines:even_length",
             "reward_isolation": "none"}
    if fault is not None:
        model["rollout_engine"] = {"class_path": "tests.reliability.failing_engines.FailingEngine",
                                   "init_args": {**fault, "marker": str(tmp_path / name / "fault-raised")}}
    cfg = {
        "seed_everything": 0,
        "trainer": {"logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                               "init_args": {"save_dir": str(tmp_path / name), "name": "run"}},
                    "enable_progress_bar": False, "enable_model_summary": False, "max_steps": N_STEPS,
                    "default_root_dir": str(tmp_path / name), "val_check_interval": 100, "limit_val_batches": 0,
                    "callbacks": [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                                   "init_args": {"every_n_train_steps": 100, "save_last": True}}]},
        "model": model,
        "data": {"task": {"operators": ["+"], "digits": 2, "num_train": 2000, "num_heldout": 20},
                 "batch_size": 2, "val_per_skill": 4},
    }
    (tmp_path / name).mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _last(tmp_path: Path, name: str, version: int) -> Path:
    return tmp_path / name / "run" / f"version_{version}" / "checkpoints" / "last.ckpt"


def _rows(tmp_path: Path, name: str, version: int) -> dict[int, dict[str, str]]:
    """The CSV logger's rows by step (the keys every policy logs per step)."""
    with open(tmp_path / name / "run" / f"version_{version}" / "metrics.csv") as f:
        rows = {}
        for row in csv.DictReader(f):
            rows.setdefault(int(row["step"]), {}).update({k: v for k, v in row.items() if v != ""})
        return rows


def _same_weights(a: Path, b: Path) -> None:
    sa, sb = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    assert sa["global_step"] == sb["global_step"] == N_STEPS
    assert sa["state_dict"].keys() == sb["state_dict"].keys()
    assert all(torch.equal(sa["state_dict"][k], sb["state_dict"][k]) for k in sa["state_dict"])  # bit-exact
    assert _equal(sa["optimizer_states"], sb["optimizer_states"])  # AdamW moments and step counts too


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def _same_logged(full: dict, resumed: dict, steps) -> None:
    keys = ("gpt2/reward", "llama/reward", "gpt2/loss", "llama/loss", "gpt2/grad_norm", "llama/grad_norm")
    for step in steps:
        for key in keys:
            assert key in full[step] and resumed[step][key] == full[step][key], (step, key)
        assert float(full[step]["gpt2/grad_norm"]) > 0 and float(full[step]["llama/grad_norm"]) > 0  # it trains


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """The run with no fault, on the plain HF engine."""
    tmp = tmp_path_factory.mktemp("full")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", ["mutual-rl"])
        main(["fit", "--config", str(_cfg(tmp, "full", None))])
    return _last(tmp, "full", 0), _rows(tmp, "full", 0)


def test_a_fault_in_sync_weights_finishes_the_step_checkpoints_it_and_resumes_bit_exactly(tmp_path, full_run):
    cfg = _cfg(tmp_path, "synced", {"phase": "sync_weights", "step": 1, "policy": "gpt2"})
    with pytest.raises(RolloutFault) as e:
        main(["fit", "--config", str(cfg)])
    last = _last(tmp_path, "synced", 0)
    assert str(e.value) == (
        "the rollout engine (FailingEngine) of policy 'gpt2' failed in sync_weights at step 1: RuntimeError: CUDA "
        "error: an illegal memory access was encountered (injected in sync_weights). Step 1 itself finished (every "
        "policy updated and logged); the engine's copy of the weights is stale, so the run stopped before using it "
        f"again. Checkpoint saved to {last} (the state after step 1; the engine loads its weights from it); to "
        f"resume, run the same command with --ckpt_path last (or --ckpt_path {last}).")
    assert isinstance(e.value.__cause__, RuntimeError)
    code, report = reported(e.value, running=True)  # what the mutual-rl command prints for it
    assert code == 1
    one_glance(report, "mutual-rl: error: the rollout engine (FailingEngine) of policy 'gpt2' failed in sync_weights "
               "at step 1", f"--ckpt_path {last}", head="mutual-rl: error: ")
    assert torch.load(last, weights_only=True)["global_step"] == 2
    _same_logged(full_run[1], _rows(tmp_path, "synced", 0), [0, 1])  # step 1 was logged before the stop
    main(["fit", "--config", str(cfg), "--ckpt_path", "last"])
    _same_weights(full_run[0], _last(tmp_path, "synced", 1))
    _same_logged(full_run[1], _rows(tmp_path, "synced", 1), [2])


def test_a_fault_in_generate_is_one_paragraph_exit_1_checkpoints_and_resumes_bit_exactly(tmp_path, full_run):
    """Through the ``mutual-rl`` command; the fault is in the second policy's sampling, after the first policy's
    sampling drew from the streams (the checkpoint holds the streams of the step's start)."""
    cfg = _cfg(tmp_path, "gen", {"phase": "generate", "step": 1, "policy": "llama"})
    proc = subprocess.run(fit_command(cfg), cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("mutual-rl: error: "))
    last = _last(tmp_path, "gen", 0)
    assert lines[head:] == [
        "mutual-rl: error: the rollout engine (FailingEngine) of policy 'llama' failed in generate at step 1: "
        "RuntimeError: CUDA error: an illegal memory access was encountered (injected in generate). Checkpoint "
        f"saved to {last} (the state before step 1, nothing of it kept); to resume, run the same command with "
        f"--ckpt_path last (or --ckpt_path {last})."]
    one_glance(proc.stderr, "policy 'llama'", "failed in generate at step 1", head="mutual-rl: error: ")
    assert torch.load(last, weights_only=True)["global_step"] == 1
    resumed = subprocess.run(fit_command(cfg, "--ckpt_path", "last"), cwd=tmp_path, env=subprocess_env(),
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _same_weights(full_run[0], _last(tmp_path, "gen", 1))
    _same_logged(full_run[1], _rows(tmp_path, "gen", 1), [1, 2])
