"""Signals a scheduler sends: SIGTERM mid-run writes ``last.ckpt``, prints how to resume and exits 143 (Lightning
alone exits 0 with no checkpoint of the step reached); resuming with ``--ckpt_path last`` then reaches exactly the
weights of an uninterrupted run."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback

from mutual_rl.callbacks.preemption import EXIT_SIGTERM
from tests.module.helpers import fit_command, subprocess_env

N_STEPS, TERM_AT = 6, 3


class PauseUntilSigterm(Callback):
    """Subprocess helper: at the start of step ``step``, create ``marker`` and wait (up to 120 s) until the trainer
    has received SIGTERM, so the parent signals the run at a known point, mid-step."""

    def __init__(self, step: int, marker: str):
        self.step, self.marker = step, marker

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            Path(self.marker).touch()
            deadline = time.monotonic() + 120
            while not trainer.received_sigterm and time.monotonic() < deadline:
                time.sleep(0.02)


def _cfg(tmp_path: Path, name: str, pause: bool) -> Path:
    callbacks = [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                  "init_args": {"every_n_train_steps": 100, "save_last": True}}]
    if pause:
        callbacks.append({"class_path": f"{__name__}.PauseUntilSigterm",
                          "init_args": {"step": TERM_AT, "marker": str(tmp_path / name / "paused")}})
    cfg = {
        "seed_everything": 0,
        "trainer": {"logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                               "init_args": {"save_dir": str(tmp_path / name), "name": "run"}},
                    "enable_progress_bar": False, "enable_model_summary": False,
                    "default_root_dir": str(tmp_path / name), "max_steps": N_STEPS, "val_check_interval": 100,
                    "limit_val_batches": 0, "callbacks": callbacks},
        "model": {"policies": [{"name": "gpt2", "model": "tiny:gpt2-bpe", "warmstart": {"steps": 20},
                                "sampling": {"n": 4, "max_new_tokens": 5}, "optimizer": {"lr": 1e-3}}],
                  "log_samples_every_n_steps": 0, "eval_at_start": False,
                  "algorithm": {"num_mini_batches": 2}},
        "data": {"task": {"operators": ["+"], "digits": 2, "num_train": 2000, "num_heldout": 20},
                 "batch_size": 4, "val_per_skill": 4},
    }
    path = tmp_path / f"{name}.yaml"
    (tmp_path / name).mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_sigterm_checkpoints_says_how_to_resume_exits_143_and_resumes_exactly(tmp_path):
    full = subprocess.Popen(fit_command(_cfg(tmp_path, "full", pause=False)), cwd=tmp_path, env=subprocess_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cfg = _cfg(tmp_path, "termed", pause=True)
    termed = subprocess.Popen(fit_command(cfg), cwd=tmp_path, env=subprocess_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (tmp_path / "termed" / "paused").exists():
        assert termed.poll() is None, termed.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the run did not reach the SIGTERM step"
        time.sleep(0.05)
    termed.send_signal(signal.SIGTERM)
    _, err = termed.communicate(timeout=120)
    assert termed.returncode == EXIT_SIGTERM == 143, err[-3000:]
    last = tmp_path / "termed" / "run" / "version_0" / "checkpoints" / "last.ckpt"
    assert f"stopped by SIGTERM after step {TERM_AT + 1}; checkpoint saved to {last}" in err
    assert f"--ckpt_path {last}" in err
    assert torch.load(last, weights_only=True)["global_step"] == TERM_AT + 1  # the step in progress finished

    resumed = subprocess.run(fit_command(cfg, "--ckpt_path", "last"), cwd=tmp_path, env=subprocess_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"--ckpt_path last -> {last}" in resumed.stderr
    _, err = full.communicate(timeout=300)
    assert full.returncode == 0, err[-3000:]

    a = torch.load(tmp_path / "full" / "run" / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(tmp_path / "termed" / "run" / "version_1" / "checkpoints" / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == N_STEPS
    start = torch.load(last, weights_only=True)["state_dict"]
    a, b = a["state_dict"], b["state_dict"]
    assert any(not torch.equal(start[k], a[k]) for k in a)  # the resumed steps did train
    diff = max((a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].is_floating_point())
    assert diff <= 1e-6
