"""A full disk where a run writes (exchange store, checkpoints, exports, the preset cache) is one ``OSError``
(ENOSPC) naming the path, the free space and what was saved (the store said a bare ``[Errno 28]`` chained three
times); a checkpoint with a pickle payload is refused naming the path, never suggesting ``weights_only=False``
(torch's own message did); ``--ckpt_path last`` with nothing to resume warns and starts from scratch, as Lightning
does (it was an error; ``--resume_required true`` keeps the error).

The full disk is an ``OSError(errno.ENOSPC)`` raised by the write's ``os.fsync`` (where a buffered write reports a
full disk) or by the writer itself; ``test_bad_checkpoints.py`` also fills a real 600 KiB tmpfs where it can."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import pytest
import torch
import yaml

from mutual_rl.callbacks.checkpointing import CheckpointRefusedError, atomic_torch_save
from mutual_rl.cli import main
from mutual_rl.exchange import ExperienceExchange
from mutual_rl.exchange.lock import LOCK_NAME
from mutual_rl.exchange.store import stored_steps
from mutual_rl.presets.store import build_once
from tests.exchange.helpers import fit_exchange
from tests.module.helpers import module, pair
from tests.reliability.one_glance import one_glance, reported


@pytest.fixture(autouse=True)
def _no_pytest_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["mutual-rl"])


def _full_disk_on(monkeypatch, needle: str) -> None:
    """``os.fsync`` of a file whose name contains ``needle`` fails with ENOSPC (others are synced as usual)."""
    real = os.fsync

    def fsync(fd):
        if needle in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_a_full_disk_in_the_exchange_store_names_the_file_the_space_and_the_steps_kept(tmp_path, monkeypatch):
    store = tmp_path / "traffic"
    _full_disk_on(monkeypatch, "step-000002.jsonl.tmp")
    with pytest.raises(OSError) as e:
        fit_exchange(tmp_path / "run", ExperienceExchange(store_dir=str(store)), 4)
    msg = str(e.value)
    assert e.value.errno == errno.ENOSPC
    assert (f"no space left on the device writing the exchange traffic of step 2 to "
            f"{str(store / 'step-000002.jsonl')!r} (") in msg and " MiB free there now)" in msg
    assert "; the recording there keeps steps 0..1 (2 files), step 2 was not written (no partial file left)" in msg
    assert "\n" not in msg and "point the run at another folder" in msg
    assert sorted(p.name for p in store.iterdir()) == ["step-000000.jsonl", "step-000001.jsonl"]  # no temp, no lock
    assert stored_steps(store) == [0, 1] and not (store / LOCK_NAME).exists()


def test_a_full_disk_at_a_checkpoint_says_the_previous_one_is_intact_or_none_was_written(tmp_path, monkeypatch):
    last = tmp_path / "ckpt" / "last.ckpt"
    _full_disk_on(monkeypatch, ".last.ckpt.")
    with pytest.raises(OSError, match=rf"writing the checkpoint {str(last)!r} \(.* MiB free there now\); no last\.ckpt "
                                      r"was written \(no partial file left\)"):
        atomic_torch_save({"step": 1}, last)
    monkeypatch.undo()
    atomic_torch_save({"step": 1}, last)
    _full_disk_on(monkeypatch, ".last.ckpt.")
    with pytest.raises(OSError, match=r"; the previous last\.ckpt is intact: free space"):
        atomic_torch_save({"step": 2}, last)
    monkeypatch.undo()
    assert torch.load(last, weights_only=True) == {"step": 1} and os.listdir(last.parent) == ["last.ckpt"]


def test_a_full_disk_at_export_says_which_policies_were_exported(tmp_path, monkeypatch):
    from mutual_rl.model.export import export_policies

    m = module(pair())
    m.configure_model()
    root = tmp_path / "export"

    def full_disk(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(m.policies["llama"], "export", full_disk)
    with pytest.raises(OSError, match=rf"writing the export of policy 'llama' to {str(root / 'llama')!r} \(.* MiB "
                                      r"free there now\); exported before it: gpt2, no folder of it was left"):
        export_policies(m.policies, root, write=True)
    assert sorted(os.listdir(root)) == ["gpt2"]


def test_a_full_disk_while_building_a_preset_caches_nothing(tmp_path):
    def build(tmp: Path):
        (tmp / "weights.bin").write_bytes(b"x" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    path = tmp_path / "cache" / "tiny-x"
    with pytest.raises(OSError, match=rf"writing the cached build of {str(path)!r} \(.* MiB free there now\); "
                                      r"nothing was cached \(the partial build was removed\), the next run builds it"):
        build_once(path, build)
    assert [p.name for p in path.parent.iterdir()] == [".tiny-x.lock"]  # no half-built folder


def _cfg(tmp_path: Path, callbacks=()) -> Path:
    cfg = {"trainer": {"logger": False, "enable_progress_bar": False, "default_root_dir": str(tmp_path / "run"),
                       "max_steps": 1, "limit_val_batches": 0, "callbacks": list(callbacks)},
           "model": {"policies": [{"name": "g", "model": "tiny:gpt2-bpe", "warmstart": {"steps": 0},
                                   "sampling": {"n": 2, "max_new_tokens": 3}}], "eval_at_start": False},
           "data": {"batch_size": 2}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class _Payload:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_a_pickle_checkpoint_is_refused_naming_the_path_and_never_suggesting_weights_only_false(tmp_path):
    marker, evil = tmp_path / "PWNED", tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "global_step": 0, "payload": _Payload(marker)}, evil)
    with pytest.raises(CheckpointRefusedError) as e:
        main(["fit", "--config", str(_cfg(tmp_path)), "--ckpt_path", str(evil)])
    msg = str(e.value)
    assert msg.startswith(f"checkpoint {str(evil)!r} was refused: it holds a Python object (getattr) that loading "
                          "would have to run")
    assert "weights_only=False" not in msg and "Resume from a checkpoint of your own run" in msg
    assert e.value.__cause__ is None and e.value.__suppress_context__  # torch's advice is not shown either
    assert not marker.exists()
    code, report = reported(e.value, running=False)  # refused by the --ckpt_path check, before any model is built
    assert code == 2
    one_glance(report, f"mutual-rl: configuration error: checkpoint {str(evil)!r} was refused",
               "Resume from a checkpoint of your own run")


def test_ckpt_path_last_with_nothing_to_resume_warns_and_starts_from_scratch(tmp_path, capsys):
    """The same command for the first submission and every requeue, as with Lightning."""
    cfg = _cfg(tmp_path, [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                           "init_args": {"save_last": True}}])
    main(["fit", "--config", str(cfg), "--ckpt_path", "last"])
    err = capsys.readouterr().err
    assert ("mutual-rl: warning: --ckpt_path last: no last.ckpt of this run was found (looked for "
            f"{tmp_path / 'run' / 'checkpoints' / 'last*.ckpt'}); starting from scratch, as Lightning does "
            "(--resume_required true makes this an error).") in err
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 1  # trained from scratch
    main(["fit", "--config", str(cfg), "--ckpt_path", "last", "--trainer.max_steps", "2"])  # the requeue
    assert f"mutual-rl: --ckpt_path last -> {last}" in capsys.readouterr().err
    assert torch.load(last, weights_only=True)["global_step"] == 2
