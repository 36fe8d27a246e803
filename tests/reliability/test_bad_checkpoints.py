"""Checkpoints and resume (the catalogue's checkpoint lines): resume by policy name with changed optimizer settings,
atomic checkpoint writes, clear errors for bad ``--ckpt_path``, and a SIGKILLed run that resumes to exactly the
uninterrupted result."""

from __future__ import annotations

import errno
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from mutual_rl.callbacks.checkpointing import AtomicCheckpointIO
from mutual_rl.cli import build_cli, main
from tests.module.helpers import datamodule, fit_command, module, pair, spec, subprocess_env, trainer
from tests.reliability import one_glance

REPO = Path(__file__).resolve().parents[2]


def parity(completion: str, answer: str) -> float:
    """Reward for the subprocess runs (``tests.reliability.test_bad_checkpoints:parity``): even length -> 1."""
    return float(len(completion) % 2 == 0)


@pytest.fixture(autouse=True)
def _no_pytest_argv(monkeypatch):
    """The CLI is driven with ``args``; pytest's own command line is not its concern."""
    monkeypatch.setattr(sys, "argv", ["mutual-rl"])


def _policy_cfg(name: str, model: str, lr: float = 1e-3) -> dict:
    return {"name": name, "model": model, "warmstart": {"steps": 20}, "sampling": {"n": 4, "max_new_tokens": 5},
            "optimizer": {"lr": lr, "weight_decay": 0.0}}


# ---------------------------------------------------------------- 2. resume: policies by name, changed settings
def _fit_one_step(tmp_path, specs):
    pl.seed_everything(0)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer(tmp_path / "a", max_steps=1, callbacks=[ckpt], enable_checkpointing=True).fit(
        module(specs), datamodule=datamodule())
    return tmp_path / "ckpt" / "last.ckpt"


class _LrSpy(Callback):
    def __init__(self):
        self.lrs = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.lrs.append([o.param_groups[0]["lr"] for o in trainer.optimizers])


@pytest.mark.slow
def test_resume_applies_changed_lr_and_betas_with_a_note(tmp_path, capsys):
    path = _fit_one_step(tmp_path, pair(lr=1e-3))
    capsys.readouterr()
    specs = pair(lr=2e-3)
    specs[1].optimizer.betas = (0.8, 0.95)
    spy = _LrSpy()
    t = trainer(tmp_path / "b", max_steps=2, callbacks=[spy], enable_checkpointing=True)
    t.fit(module(specs), datamodule=datamodule(), ckpt_path=path)
    assert spy.lrs == [[2e-3, 2e-3]]  # the resumed step trains with the configured lr
    assert t.optimizers[1].param_groups[0]["betas"] == (0.8, 0.95)
    out = capsys.readouterr().out
    assert "policy 'gpt2' optimizer.lr 0.001 -> 0.002" in out
    assert "policy 'llama' optimizer.lr 0.001 -> 0.002" in out
    assert "policy 'llama' optimizer.betas (0.9, 0.99) -> (0.8, 0.95)" in out
    assert "policy 'gpt2' optimizer.betas" not in out  # unchanged settings: no note


@pytest.mark.slow
def test_resume_matches_policies_by_name_not_position(tmp_path):
    path = _fit_one_step(tmp_path, pair())
    saved = torch.load(path, weights_only=False)
    assert saved["mutual_rl"]["policies"] == ["gpt2", "llama"]
    saved_avg = {name: {i: s["exp_avg"] for i, s in st["state"].items()}
                 for name, st in zip(["gpt2", "llama"], saved["optimizer_states"])}
    m = module(pair()[::-1])  # [llama, gpt2]
    t = trainer(tmp_path / "b", max_steps=1, enable_checkpointing=True)
    t.fit(m, datamodule=datamodule(), ckpt_path=path)  # restores, nothing left to train
    for name, opt in zip(["llama", "gpt2"], t.optimizers):
        got = {i: s["exp_avg"] for i, s in opt.state_dict()["state"].items()}
        assert got.keys() == saved_avg[name].keys() and got, name
        assert all(torch.equal(got[i], saved_avg[name][i]) for i in got), name


@pytest.mark.slow
def test_resume_with_a_renamed_policy_is_one_error_naming_both_lists(tmp_path):
    path = _fit_one_step(tmp_path, pair())
    specs = [spec("gpt2", "tiny:gpt2-bpe"), spec("llama2", "tiny:llama-char")]
    with one_glance.raises(ValueError) as e:
        trainer(tmp_path / "b", max_steps=2, enable_checkpointing=True).fit(
            module(specs), datamodule=datamodule(), ckpt_path=path)
    msg = str(e.value)
    assert "holds policies ['gpt2', 'llama'] but model.policies lists ['gpt2', 'llama2']" in msg
    assert "only in the checkpoint: ['llama']" in msg and "only in the config: ['llama2']" in msg
    assert "matched by name" in msg and str(path) in msg


@pytest.mark.slow
def test_resume_with_an_extra_policy_is_one_error(tmp_path):
    path = _fit_one_step(tmp_path, [spec("gpt2", "tiny:gpt2-bpe")])
    with one_glance.raises(ValueError, match=r"holds policies \['gpt2'\] but model.policies lists \['gpt2', 'llama'\]"):
        trainer(tmp_path / "b", max_steps=2, enable_checkpointing=True).fit(
            module(pair()), datamodule=datamodule(), ckpt_path=path)


# --------------------------------------------------------------------------------- 3. atomic checkpoint writes
def _cli_trainer(tmp_path):
    cli = build_cli(["--model.policies", "[{name: a, model: 'tiny:gpt2-bpe'}]", "--trainer.logger", "false",
                     f"--trainer.default_root_dir={tmp_path}"], run=False)
    return cli.trainer


@pytest.mark.slow
def test_cli_writes_checkpoints_with_the_atomic_plugin(tmp_path):
    assert type(_cli_trainer(tmp_path).strategy.checkpoint_io) is AtomicCheckpointIO


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads file names from /proc/self/fd")
def test_checkpoint_is_written_next_to_its_name_fsynced_then_renamed(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(a), str(b))),
                                                     real_replace(a, b))[1])
    monkeypatch.setattr(os, "rename", lambda a, b: (events.append(("replace", str(a), str(b))),
                                                    real_replace(a, b))[1])
    target = tmp_path / "ckpt" / "last.ckpt"
    _cli_trainer(tmp_path).strategy.checkpoint_io.save_checkpoint({"x": torch.arange(3)}, target)
    moves = [e for e in events if e[0] == "replace"]
    assert len(moves) == 1 and moves[0][2] == str(target)
    tmp = moves[0][1]
    assert Path(tmp).parent == target.parent  # same directory, so the rename is atomic
    assert ("fsync", tmp) in events[: events.index(moves[0])]  # the data is on disk before the rename
    assert torch.equal(torch.load(target)["x"], torch.arange(3))


def test_full_disk_mid_write_keeps_the_previous_last_ckpt(tmp_path, monkeypatch, request):
    """The checkpoint disk fills up half way through writing: ``last.ckpt`` stays the previous, complete file.

    The system temp directory is put on another filesystem (``/dev/shm``) when there is one, as with a tmpfs
    ``/tmp`` and checkpoints on disk: Lightning's own writer then copies into the final file."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shm.stat().st_dev != tmp_path.stat().st_dev:
        other_fs = Path(tempfile.mkdtemp(dir=shm))
        request.addfinalizer(lambda: shutil.rmtree(other_fs, ignore_errors=True))
        monkeypatch.setattr(tempfile, "tempdir", str(other_fs))
    ckpt_dir = tmp_path / "ckpt"
    io_plugin = _cli_trainer(tmp_path).strategy.checkpoint_io
    last = ckpt_dir / "last.ckpt"
    io_plugin.save_checkpoint({"step": 1, "w": torch.ones(50_000)}, last)
    good = last.read_bytes()

    real_save = torch.save

    def full_disk_save(obj, f, *args, **kwargs):
        if isinstance(f, io.BytesIO):
            return real_save(obj, f, *args, **kwargs)
        buf = io.BytesIO()
        real_save(obj, buf)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        f.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def full_disk_sendfile(out_fd, in_fd, offset, count):
        os.write(out_fd, os.pread(in_fd, max(1, os.fstat(in_fd).st_size // 2), 0))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk_save)
    monkeypatch.setattr(os, "sendfile", full_disk_sendfile)
    with one_glance.raises(OSError) as e:
        io_plugin.save_checkpoint({"step": 2, "w": torch.zeros(50_000)}, last)
    assert e.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert last.read_bytes() == good
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["last.ckpt"]  # no partial or temporary file left
    assert torch.load(last)["step"] == 1


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 600 KiB tmpfs (needs root and mount permission, as on the CI machine; skipped elsewhere)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root): the real full-disk test needs one")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_a_really_full_disk_names_the_checkpoint_and_the_free_space(tiny_disk):
    """torch.save on a full disk says ``[enforce fail at inline_container.cc:672] . unexpected pos``: the error
    now names the file and the space left, and nothing is left behind."""
    last = tiny_disk / "ckpt" / "last.ckpt"
    with one_glance.raises(OSError) as e:
        AtomicCheckpointIO().save_checkpoint({"w": torch.ones(300_000)}, last)  # 1.2 MB
    assert e.value.errno == errno.ENOSPC
    assert f"no space left on the device writing the checkpoint {str(last)!r} (0.6 MiB free there now)" in str(e.value)
    assert "inline_container" in str(e.value.__cause__)
    assert list(last.parent.iterdir()) == []


def test_a_full_disk_at_export_names_the_policy_and_the_folder(tiny_disk):
    """safetensors says ``SafetensorError: ... I/O error: No space left on device (os error 28)`` (not an OSError,
    so it also escaped the export's error handling): now one OSError naming the policy and the folder, and no
    half-written folder is left."""
    from mutual_rl.model.export import export_policies
    from mutual_rl.model.policy import build_policy

    policy = build_policy(spec("g", "tiny:gpt2-bpe"))
    with one_glance.raises(OSError) as e:
        export_policies({"g": policy}, tiny_disk / "export", write=True)
    assert e.value.errno == errno.ENOSPC
    assert f"writing the export of policy 'g' to {str(tiny_disk / 'export' / 'g')!r}" in str(e.value)
    assert "os error 28" in str(e.value.__cause__)
    assert list((tiny_disk / "export").iterdir()) == []


# ------------------------------------------------------------------------------- 4. bad --ckpt_path, clear errors
def _fit_args(tmp_path, *extra):
    cfg = {"trainer": {"logger": False, "enable_progress_bar": False, "default_root_dir": str(tmp_path),
                       "max_steps": 1},
           "model": {"policies": [_policy_cfg("g", "tiny:gpt2-bpe")]}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return ["fit", "--config", str(path), *extra]


@pytest.mark.slow
def test_random_bytes_ckpt_path_is_not_a_valid_checkpoint(tmp_path):
    bad = tmp_path / "random.ckpt"
    bad.write_bytes(os.urandom(4096))
    with one_glance.raises(ValueError, match=f"checkpoint '{bad}' is not a valid mutual-rl checkpoint") as e:
        main(_fit_args(tmp_path, "--ckpt_path", str(bad)))
    assert "weights_only" not in str(e.value)


@pytest.mark.slow
def test_truncated_ckpt_path_is_not_a_valid_checkpoint(tmp_path):
    good = _fit_one_step(tmp_path, [spec("g", "tiny:gpt2-bpe")])
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with one_glance.raises(ValueError, match=f"checkpoint '{cut}' is not a valid mutual-rl checkpoint.*truncated"):
        main(_fit_args(tmp_path, "--ckpt_path", str(cut)))
    with one_glance.raises(ValueError, match="is not a valid mutual-rl checkpoint"):  # also through Trainer.fit
        trainer(tmp_path / "t", plugins=[AtomicCheckpointIO()]).fit(
            module([spec("g", "tiny:gpt2-bpe")]), datamodule=datamodule(), ckpt_path=cut)


@pytest.mark.slow
def test_missing_ckpt_path_names_the_path(tmp_path):
    missing = tmp_path / "nope" / "last.ckpt"
    with one_glance.raises(FileNotFoundError, match=f"checkpoint '{missing}' does not exist"):
        main(_fit_args(tmp_path, "--ckpt_path", str(missing)))


@pytest.mark.slow
def test_lightning_checkpoint_without_mutual_rl_state_is_an_error(tmp_path):
    good = _fit_one_step(tmp_path, [spec("g", "tiny:gpt2-bpe")])
    ckpt = torch.load(good, weights_only=False)
    del ckpt["mutual_rl"]
    other = tmp_path / "other.ckpt"
    torch.save(ckpt, other)
    with one_glance.raises(ValueError, match=f"checkpoint '{other}' is not a mutual-rl checkpoint"):
        trainer(tmp_path / "b", max_steps=2).fit(module([spec("g", "tiny:gpt2-bpe")]), datamodule=datamodule(),
                                                 ckpt_path=other)


# ------------------------------------------------------------------------- 7. kill -9 mid-run, then resume
N_STEPS, KILL_AFTER = 6, 3


class PauseAtStep(Callback):
    """Subprocess helper: once ``step`` steps are done (and checkpointed), create ``marker`` and sleep, so the
    parent kills the run at a known point."""

    def __init__(self, step: int, marker: str, seconds: float = 120.0):
        self.step, self.marker, self.seconds = step, marker, seconds

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            Path(self.marker).touch()
            time.sleep(self.seconds)


def _kill_cfg(tmp_path: Path, name: str, pause: bool) -> Path:
    callbacks = [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                  "init_args": {"dirpath": str(tmp_path / name / "ckpt"), "every_n_train_steps": 1,
                                "save_top_k": -1, "save_last": True}}]
    if pause:
        callbacks.append({"class_path": f"{__name__}.PauseAtStep",
                          "init_args": {"step": KILL_AFTER, "marker": str(tmp_path / name / "paused")}})
    cfg = {
        "seed_everything": 0,
        "trainer": {"logger": False, "enable_progress_bar": False, "enable_model_summary": False,
                    "default_root_dir": str(tmp_path / name), "max_steps": N_STEPS, "val_check_interval": 2,
                    "limit_val_batches": 1, "callbacks": callbacks},
        "model": {"policies": [_policy_cfg("gpt2", "tiny:gpt2-bpe"), _policy_cfg("llama", "tiny:llama-char")],
                  "reward": f"{__name__}:parity", "evaluation": {"k": 2}, "log_samples_every_n_steps": 0,
                  "algorithm": {"num_mini_batches": 2}},
        "data": {"task": {"operators": ["+", "-"], "digits": 2, "num_train": 2000, "num_heldout": 20},
                 "batch_size": 4, "val_batch_size": 8, "val_per_skill": 4},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    state = torch.load(ckpt, weights_only=False)
    assert state["global_step"] == N_STEPS
    return state["state_dict"]


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_equals_the_uninterrupted_run(tmp_path):
    full = subprocess.Popen(fit_command(_kill_cfg(tmp_path, "full", pause=False)), cwd=REPO, env=subprocess_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    killed = subprocess.Popen(fit_command(_kill_cfg(tmp_path, "killed", pause=True)), cwd=REPO, env=subprocess_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ckpt_dir = tmp_path / "killed" / "ckpt"
    deadline = time.monotonic() + 240
    while not (tmp_path / "killed" / "paused").exists():
        assert killed.poll() is None, killed.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the run did not reach the kill step"
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.wait(30)
    killed.stderr.close()
    assert killed.returncode == -signal.SIGKILL
    assert not list(ckpt_dir.glob(f"*step={KILL_AFTER + 1}.ckpt"))  # really stopped before the end
    assert torch.load(ckpt_dir / "last.ckpt", weights_only=False)["global_step"] == KILL_AFTER

    resumed = subprocess.run(fit_command(_kill_cfg(tmp_path, "resumed", pause=False), "--ckpt_path",
                                      str(ckpt_dir / "last.ckpt")),
                             cwd=REPO, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _, err = full.communicate(timeout=300)
    assert full.returncode == 0, err[-3000:]

    a = _weights(tmp_path / "full" / "ckpt" / "last.ckpt")
    b = _weights(tmp_path / "resumed" / "ckpt" / "last.ckpt")
    assert a.keys() == b.keys()
    start = torch.load(ckpt_dir / "last.ckpt", weights_only=False)["state_dict"]
    assert any(not torch.equal(start[k], a[k]) for k in a)  # the resumed steps did train
    diff = {k: (a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].is_floating_point()}
    assert max(diff.values()) <= 1e-6, sorted(diff.items(), key=lambda kv: -kv[1])[:5]
