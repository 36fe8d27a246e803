"""An error of ``mutual-rl`` is one short paragraph, not a traceback: a configuration error (a bad value, a YAML
tab, a ``base:`` loop) prints ``mutual-rl: configuration error: ...`` naming the setting and the config file and
exits 2 (a bad value used to end after ~65 lines of jsonargparse traceback with exit 1, a tab or a loop exited 1);
an error mutual-rl raises on purpose at run time prints ``mutual-rl: error: ...`` and exits 1;
``MUTUAL_RL_DEBUG=1`` shows the traceback. Real ``python -m mutual_rl.cli fit`` subprocesses."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from mutual_rl.cli_errors import MAX_LINES, paragraph
from tests.module.helpers import fit_command, subprocess_env

POLICY = {"name": "g", "model": "tiny:gpt2-bpe", "warmstart": {"steps": 0}, "sampling": {"n": 2, "max_new_tokens": 3}}


def _write(tmp_path: Path, policy: dict | None = None, text: str | None = None, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
        return path
    cfg = {"trainer": {"logger": False, "enable_progress_bar": False, "max_steps": 1,
                       "default_root_dir": str(tmp_path / "run")},
           "model": {"policies": [{**POLICY, **(policy or {})}]}}
    path.write_text(yaml.safe_dump(cfg))
    return path


def _fit(cfg: Path, tmp_path: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(fit_command(cfg), cwd=tmp_path, env={**subprocess_env(), **env}, capture_output=True,
                          text=True, timeout=300)


def _reported(proc: subprocess.CompletedProcess) -> list[str]:
    """The lines from the report's head on (Lightning's seed line may come before it)."""
    lines = proc.stderr.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("mutual-rl: "))
    return lines[start:]


@pytest.mark.parametrize(("policy", "names"), [
    ({"optimizer": {"lr": -1}}, "optimizer.lr must be > 0 (got -1.0)"),
    ({"sampling": {"n": 0, "max_new_tokens": 3}}, "sampling.n"),
])
def test_a_bad_value_is_one_paragraph_naming_the_setting_and_the_file_exit_2(tmp_path, policy, names):
    cfg = _write(tmp_path, policy)
    proc = _fit(cfg, tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = _reported(proc)
    assert lines[0].startswith("mutual-rl: configuration error: ") and names in lines[0], proc.stderr
    assert len(lines) <= MAX_LINES and f"(configuration: {cfg})" in lines[-1]
    assert "Traceback" not in proc.stderr and "Union" not in proc.stderr


def test_a_yaml_tab_and_a_base_loop_are_configuration_errors_exit_2(tmp_path):
    tab = _write(tmp_path, text="trainer:\n\tmax_steps: 1\n", name="tab.yaml")
    proc = _fit(tab, tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = _reported(proc)
    assert lines[0].startswith(f"mutual-rl: configuration error: config {tab}: line 2, column 1") and len(lines) <= 6
    a = _write(tmp_path, text="base: b.yaml\n", name="a.yaml")
    _write(tmp_path, text="base: a.yaml\n", name="b.yaml")
    proc = _fit(a, tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert _reported(proc)[0].startswith(f"mutual-rl: configuration error: config {a}: its base: chain comes back "
                                         "to itself")
    assert "Traceback" not in proc.stderr


def test_mutual_rl_debug_shows_the_traceback(tmp_path):
    proc = _fit(_write(tmp_path, {"optimizer": {"lr": -1}}), tmp_path, MUTUAL_RL_DEBUG="1")
    assert proc.returncode == 1 and "Traceback (most recent call last)" in proc.stderr
    assert "ValueError: optimizer.lr must be > 0 (got -1.0)." in proc.stderr


def test_a_long_message_is_cut_to_six_lines_saying_how_to_see_it_all():
    text = paragraph("mutual-rl: error", ValueError("\n".join(f"line {i}" for i in range(20))))
    lines = text.splitlines()
    assert len(lines) == MAX_LINES and lines[0] == "mutual-rl: error: line 0" and lines[4] == "line 4"
    assert lines[-1] == "... (cut; MUTUAL_RL_DEBUG=1 shows all of it and the traceback)"
