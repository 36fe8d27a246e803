"""A non-finite stop through the command: a gradient turns NaN in a real `mutual-rl fit` (a callback named in the
config poisons it after the first backward), and the command stops with one paragraph naming the policy, the
quantity and the fix, exit 1, no traceback; nothing of that update reaches the weights (the run ends there)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from lightning.pytorch.callbacks import Callback

from tests.module.helpers import fit_command, subprocess_env
from tests.reliability.one_glance import one_glance


def parity(completion: str, answer: str) -> float:
    """1 iff the response has an even length: mixed groups from the first step, so the update runs a backward."""
    return float(len(completion) % 2 == 0)


class PoisonGradient(Callback):
    """After the first backward, sets one gradient of the policy to NaN (what an overflow would leave)."""

    def on_after_backward(self, trainer, pl_module):
        for p in pl_module.parameters():
            if p.grad is not None:
                p.grad.fill_(float("nan"))
                return


def test_a_non_finite_gradient_stops_the_command_with_one_paragraph(tmp_path: Path):
    cfg = {"trainer": {"logger": False, "enable_progress_bar": False, "enable_checkpointing": False, "max_steps": 2,
                       "default_root_dir": str(tmp_path / "run"), "num_sanity_val_steps": 0, "limit_val_batches": 0,
                       "callbacks": [{"class_path": "tests.reliability.test_nonfinite_stop.PoisonGradient"}]},
           "model": {"policies": [{"name": "g", "model": "tiny:gpt2-bpe", "warmstart": {"steps": 0},
                                   "sampling": {"n": 4, "max_new_tokens": 4}}],
                     "reward": "tests.reliability.test_nonfinite_stop:parity", "eval_at_start": False},
           "data": {"batch_size": 8}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(fit_command(path), cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = one_glance(proc.stderr, "policy 'g'", "non-finite", "on_nonfinite: skip", head="mutual-rl: error: ")
    assert "gradient" in report, report
