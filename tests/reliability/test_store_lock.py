"""One recording run per exchange store folder, enforced by an OS lock held for the whole run: a second run started
on the same ``store_dir`` while the first records is refused at start naming the holder's pid and command (two
such runs used to both exit 0 with their steps mixed), a replay of a folder still being recorded is refused the same
way, and a lock left by a killed run is taken over with a one-line warning."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import yaml
from lightning.pytorch.callbacks import Callback

from mutual_rl.exchange import ExperienceExchange
from mutual_rl.exchange.lock import LOCK_NAME, StoreLock, check_not_being_recorded
from mutual_rl.exchange.store import StoreInUseError, stored_steps
from tests.exchange.helpers import fit_exchange
from tests.module.helpers import fit_command, subprocess_env
from tests.reliability.one_glance import one_glance

STEPS, PAUSE_AT = 3, 1


class PauseUntilFile(Callback):
    """Subprocess helper: at the start of step ``step``, create ``marker`` and wait (up to 180 s) for ``go``."""

    def __init__(self, step: int, marker: str, go: str):
        self.step, self.marker, self.go = step, marker, go

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            Path(self.marker).touch()
            deadline = time.monotonic() + 180
            while not Path(self.go).exists() and time.monotonic() < deadline:
                time.sleep(0.05)


def _cfg(tmp_path: Path, name: str, exchange: dict, policy: str = "gpt2", pause: bool = False,
         regime: str | None = None) -> Path:
    callbacks = [{"class_path": "mutual_rl.exchange.ExperienceExchange", "init_args": exchange}]
    if pause:
        callbacks.append({"class_path": f"{__name__}.PauseUntilFile",
                          "init_args": {"step": PAUSE_AT, "marker": str(tmp_path / "paused"),
                                        "go": str(tmp_path / "go")}})
    model = {"policies": [{"name": policy, "model": f"tiny:{policy}-{'bpe' if policy == 'gpt2' else 'char'}",
                           "warmstart": {"steps": 0}, "sampling": {"n": 2, "max_new_tokens": 4}}],
             "log_samples_every_n_steps": 0, "eval_at_start": False, "algorithm": {"num_mini_batches": 1}}
    if regime:
        model["regime"] = regime
    cfg = {
        "seed_everything": 0,
        "trainer": {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
                    "enable_model_summary": False, "default_root_dir": str(tmp_path / name), "max_steps": STEPS,
                    "limit_val_batches": 0, "callbacks": callbacks},
        "model": model,
        "data": {"task": {"operators": ["+"], "digits": 2, "num_train": 200, "num_heldout": 20}, "batch_size": 2,
                 "val_per_skill": 4},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _run(cmd, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=tmp_path, env=subprocess_env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=300)


@pytest.mark.slow
def test_a_second_run_and_a_replay_are_refused_while_a_run_records_into_the_folder(tmp_path):
    store = tmp_path / "traffic"
    first_cfg = _cfg(tmp_path, "first", {"store_dir": str(store)}, pause=True)
    first = subprocess.Popen(fit_command(first_cfg), cwd=tmp_path, env=subprocess_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "paused").exists():
            assert first.poll() is None, first.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the first run did not reach its pause"
            time.sleep(0.05)
        holder = json.loads((store / LOCK_NAME).read_text())
        assert holder["pid"] == first.pid and str(first_cfg) in holder["command"]
        before = {p.name: p.read_bytes() for p in store.glob("step-*.jsonl")}
        assert sorted(before) == ["step-000000.jsonl"]

        second = _run(fit_command(_cfg(tmp_path, "second", {"store_dir": str(store)})), tmp_path)
        assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr[-3000:]
        one_glance(second.stderr, f"store_dir {store}", f"pid {first.pid}", head="mutual-rl: error: ")
        assert (f"mutual-rl: error: store_dir {store} is being recorded right now by another run: pid {first.pid}, "
                "started " in second.stderr), second.stderr[-3000:]
        assert f"command: {sys.executable} -m mutual_rl.cli fit --config {first_cfg}" in second.stderr
        assert f"store_dir: {store}-2" in second.stderr

        replay = _run(fit_command(_cfg(tmp_path, "replay", {"replay_dir": str(store), "replay_policies": ["gpt2"],
                                                             "store_dir": str(tmp_path / "replayed")},
                                       policy="llama", regime="sgt")), tmp_path)
        assert replay.returncode == 1 and "Traceback" not in replay.stderr
        one_glance(replay.stderr, f"replay_dir {store}", f"pid {first.pid}", head="mutual-rl: error: ")
        assert f"mutual-rl: error: replay_dir {store} is being recorded right now by another run: pid {first.pid}" in replay.stderr, \
            replay.stderr[-3000:]
        assert "Replay it after that run has ended" in replay.stderr
        assert {p.name: p.read_bytes() for p in store.glob("step-*.jsonl")} == before  # nothing written by them
        assert not (tmp_path / "replayed").exists() or stored_steps(tmp_path / "replayed") == []
    finally:
        (tmp_path / "go").touch()
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    assert stored_steps(store) == list(range(STEPS))
    run_ids = {json.loads(p.read_text().split("\n")[0])["run_id"] for p in store.glob("step-*.jsonl")}
    assert len(run_ids) == 1  # one run's recording, not two mixed
    assert not (store / LOCK_NAME).exists()  # released at the end of the run


def test_the_lock_is_held_for_the_fit_and_released_at_its_end_and_on_an_error(tmp_path):
    store = tmp_path / "traffic"

    class Probe(Callback):
        seen: list = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            with pytest.raises(StoreInUseError, match=rf"pid {os.getpid()}, started "):
                StoreLock(store).acquire()
            Probe.seen.append(json.loads((store / LOCK_NAME).read_text())["pid"])

    fit_exchange(tmp_path / "a", ExperienceExchange(store_dir=str(store)), 2, callbacks=[Probe()])
    assert Probe.seen == [os.getpid()] * 2 and not (store / LOCK_NAME).exists()

    class Boom(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fit_exchange(tmp_path / "b", ExperienceExchange(store_dir=str(tmp_path / "b-traffic")), 2,
                     callbacks=[Boom()])
    assert not (tmp_path / "b-traffic" / LOCK_NAME).exists()
    StoreLock(tmp_path / "b-traffic").acquire()  # free again


def _dead_holder(store: Path) -> int:
    """A real process that takes the store's lock and is then killed with SIGKILL (it cannot release it)."""
    code = ("import sys, time; from mutual_rl.exchange.lock import StoreLock; StoreLock(sys.argv[1]).acquire(); "
            "print('held', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(store)], env=subprocess_env(), stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    with pytest.raises(StoreInUseError, match=rf"pid {proc.pid}, started .*command: {sys.executable} -c"):
        StoreLock(store).acquire()
    with pytest.raises(StoreInUseError, match=rf"replay_dir {store} is being recorded .* pid {proc.pid}"):
        check_not_being_recorded(store)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc.pid


def test_a_stale_lock_of_a_killed_run_is_taken_over_with_one_warning(tmp_path):
    store = tmp_path / "traffic"
    pid = _dead_holder(store)
    assert json.loads((store / LOCK_NAME).read_text())["pid"] == pid  # the file is left behind
    check_not_being_recorded(store)  # a stale lock does not stop a replay
    with pytest.warns(UserWarning, match=rf"store_dir {store}: took over the stale lock left by pid {pid}, "
                                         r"started .*, which is no longer running") as caught:
        fit_exchange(tmp_path / "a", ExperienceExchange(store_dir=str(store)), 2)
    assert len([w for w in caught if "stale lock" in str(w.message)]) == 1
    assert "\n" not in str(next(w for w in caught if "stale lock" in str(w.message)).message)
    assert stored_steps(store) == [0, 1] and not (store / LOCK_NAME).exists()
    with warnings.catch_warnings():  # released cleanly: the next run takes it without a warning
        warnings.filterwarnings("error", message=".*stale lock")
        lock = StoreLock(store)
        assert lock.acquire() is None
        lock.release()
