"""A preset build worker whose trainer is killed by a signal ends itself (instead of building on for as long as
the warm-up takes, holding a core): a real worker, started by a real parent that is then killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mutual_rl.presets.build_worker import PINNED_ENV

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_worker_of_a_killed_parent_stops(tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    args = {"name": "tiny:llama-char", "key": "orphan-test", "tmp": str(build), "seed": 0,
            "warmstart": {"steps": 100000}, "task_class": "mutual_rl.data.task:ArithmeticTask",
            "task": {"operators": ["+"], "digits": 2, "num_train": 200, "num_heldout": 20},
            "prompt_template": "{problem}", "chat_template": False, "cache_dir": str(tmp_path / "cache")}
    spec = tmp_path / "args.json"
    spec.write_text(json.dumps(args))
    # the parent: a Python process that starts the worker as run_pinned does, writes its pid and waits on it
    parent_code = ("import subprocess, sys, os; "
                   f"p = subprocess.Popen([sys.executable, '-m', 'mutual_rl.presets.build_worker', {str(spec)!r}], "
                   "stderr=open(sys.argv[2], 'w')); open(sys.argv[1], 'w').write(str(p.pid)); p.wait()")
    pid_file, err_file = tmp_path / "worker.pid", tmp_path / "worker.err"
    parent = subprocess.Popen([sys.executable, "-c", parent_code, str(pid_file), str(err_file)], cwd=ROOT,
                              env={**os.environ, **PINNED_ENV})
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    worker = int(pid_file.read_text())
    while "building" not in err_file.read_text():  # the worker is in its warm-up (its progress bar is up)
        assert time.monotonic() < deadline, err_file.read_text()[-2000:]
        time.sleep(0.2)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 15
    while _alive(worker):
        assert time.monotonic() < deadline, "the orphaned worker is still building"
        time.sleep(0.2)
    assert "is gone; stopping." in err_file.read_text()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("done.json"))  # nothing cached


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan is reaped by init, or stays a zombie until it is)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status
