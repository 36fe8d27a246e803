"""The progress bar of ``mutual-rl fit`` (``mutual_rl.callbacks.progress``): a short real fit run as the command,
its bar read from stdout: steps out of ``max_steps``, s/step, an ETA and each policy's reward; no epoch counter, no
``v_num``, no ``it/s``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mutual_rl.config_files import load_config

ROOT = Path(__file__).resolve().parents[2]

#: One refresh of the training bar, e.g. ``Training  3/4 |███  | 00:01 elapsed, ETA 00:00,  0.60s/step, gpt2/...``
LINE = re.compile(r"Training\s+(\d+)/(\d+) \|.*?\| (\d\d:\d\d) elapsed, ETA (\d\d:\d\d|\?),\s+([\d.]+|\?)s/step"
                  r"(?:, gpt2/reward=([\d.]+), llama/reward=([\d.]+))?")


def _short_config(tmp_path: Path, steps: int) -> Path:
    """configs/grpo.yaml as shipped (the shipped presets: nothing is built), with `steps` steps of 4 prompts, no
    evaluation, logger or checkpoint."""
    cfg = load_config(ROOT / "configs" / "grpo.yaml")
    cfg["trainer"].update(max_steps=steps, logger=False, enable_checkpointing=False, limit_val_batches=0,
                          default_root_dir=str(tmp_path))
    cfg["trainer"]["callbacks"] = [c for c in cfg["trainer"].get("callbacks") or []
                                   if "ModelCheckpoint" not in str(c.get("class_path"))]
    cfg["data"]["batch_size"] = 4
    cfg["model"]["export_dir"] = str(tmp_path / "export")
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_fit_shows_steps_of_max_steps_seconds_per_step_eta_and_each_policy_reward(tmp_path):
    steps = 4
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MUTUAL_RL_PRESET_REPORT": "0"}
    out = subprocess.run([sys.executable, "-m", "mutual_rl.cli", "fit", "--config", str(_short_config(tmp_path, steps))],
                         capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    refreshes = [m for m in map(LINE.search, re.split(r"[\r\n]", text)) if m]
    assert refreshes, f"no training bar in the output:\n{text[-3000:]}"
    assert {int(m.group(2)) for m in refreshes} == {steps}  # n / max_steps, every refresh
    after_steps = [m for m in refreshes if m.group(6) is not None]
    counts = [int(m.group(1)) for m in after_steps]
    assert sorted(set(counts)) == list(range(1, steps + 1)) and counts == sorted(counts), [m.group(0) for m in refreshes]
    for m in after_steps:
        assert m.group(4) != "?" and float(m.group(5)) > 0  # an ETA and a rate once a step is done
        assert 0.0 <= float(m.group(6)) <= 1.0 and 0.0 <= float(m.group(7)) <= 1.0  # integer_match rewards
    assert after_steps[-1].group(4) == "00:00"  # nothing left after the last step
    assert "Epoch" not in text and "v_num" not in text, text[-2000:]
    bar_lines = [line for line in re.split(r"[\r\n]", text) if "Training" in line]
    assert not [line for line in bar_lines if "it/s" in line], bar_lines  # s/step, not Lightning's batches/s
