"""No code runs that the user did not ask for: a checkpoint served over http is never unpickled, a checkpoint's
``hyper_parameters`` never change the configuration, and every checkpoint load is ``weights_only``. Also the
``--ckpt_path`` shapes that used to fail late: a directory, and ``last`` across version folders."""

from __future__ import annotations

import functools
import http.server
import os
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml

from mutual_rl.callbacks.checkpointing import AtomicCheckpointIO, CheckpointRefusedError, find_last_checkpoint
from mutual_rl.cli import MutualRLCLI, main
from mutual_rl.data.datamodule import PromptDataModule
from mutual_rl.module import MutualRLModule
from tests.reliability.one_glance import one_glance, reported


@pytest.fixture(autouse=True)
def _no_pytest_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["mutual-rl"])


class _Payload:
    """Unpickling this creates ``marker``: what a malicious checkpoint does (``os.system`` in the wild)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def _malicious_checkpoint(path: Path, marker: Path) -> Path:
    torch.save({"state_dict": {}, "global_step": 0, "payload": _Payload(marker)}, path)
    return path


@pytest.fixture
def http_server(tmp_path):
    """A web server on 127.0.0.1 serving ``tmp_path / "served"``; yields its base URL."""
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", served
    server.shutdown()
    server.server_close()


class _Parsed(Exception):
    """Raised by :class:`_ParseOnly` with the configuration the CLI would instantiate."""


class _ParseOnly(MutualRLCLI):
    """The ``mutual-rl`` CLI up to the point where it would build the classes (nothing built, nothing loaded)."""

    def before_instantiate_classes(self) -> None:
        raise _Parsed(self.config)


def _parsed(args: list[str]):
    with pytest.raises(_Parsed) as e:
        _ParseOnly(MutualRLModule, PromptDataModule, args=args, save_config_kwargs={"overwrite": True})
    return e.value.args[0]


def _cfg(tmp_path: Path, **trainer) -> Path:
    cfg = {"trainer": {"logger": False, "enable_progress_bar": False, "default_root_dir": str(tmp_path / "run"),
                       "max_steps": 1, **trainer},
           "model": {"policies": [{"name": "g", "model": "tiny:gpt2-bpe", "warmstart": {"steps": 0},
                                   "sampling": {"n": 2, "max_new_tokens": 3}}]}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_pickle_served_over_http_is_refused_and_never_run(tmp_path, http_server):
    url, served = http_server
    marker = tmp_path / "PWNED"
    _malicious_checkpoint(served / "evil.ckpt", marker)
    with pytest.raises(ValueError, match=r"ckpt_path 'http://127\.0\.0\.1:\d+/evil\.ckpt' is a web URL.*curl") as e:
        main(["fit", "--config", str(_cfg(tmp_path)), "--ckpt_path", f"{url}/evil.ckpt"])
    assert not marker.exists()
    code, report = reported(e.value, running=False)  # what the mutual-rl command prints for it
    assert code == 2
    one_glance(report, f"ckpt_path '{url}/evil.ckpt' is a web URL", "curl", head="mutual-rl: configuration error: ")
    # the checkpoint plugin refuses it too (Trainer.fit(ckpt_path=url) from Python)
    with pytest.raises(ValueError, match="is a web URL"):
        AtomicCheckpointIO().load_checkpoint(f"{url}/evil.ckpt")
    assert not marker.exists()
    # the same file as a local path: torch's weights_only loader refuses the payload, by default
    with pytest.raises(CheckpointRefusedError, match=r"evil\.ckpt' was refused: it holds a Python object"):
        AtomicCheckpointIO().load_checkpoint(served / "evil.ckpt")
    assert not marker.exists()


def test_checkpoint_loads_are_weights_only_unless_the_caller_says_otherwise(tmp_path):
    """Lightning passes ``weights_only=None``; the plugin makes that ``True``. An explicit ``False`` (the caller's
    own choice for a file they trust) is kept."""
    marker = tmp_path / "PWNED"
    path = _malicious_checkpoint(tmp_path / "evil.ckpt", marker)
    with pytest.raises(CheckpointRefusedError, match=r"evil\.ckpt' was refused: it holds a Python object"):
        AtomicCheckpointIO().load_checkpoint(path, weights_only=None)
    assert not marker.exists()
    AtomicCheckpointIO().load_checkpoint(path, weights_only=False)
    assert marker.exists()


def test_hyper_parameters_in_a_checkpoint_never_change_the_config(tmp_path, capsys):
    """A crafted checkpoint with ``hyper_parameters`` switching ``trust_remote_code`` on and replacing the reward:
    Lightning's CLI merges them into the parsed config; mutual-rl ignores them with a note."""
    crafted = tmp_path / "crafted.ckpt"
    torch.save({"state_dict": {}, "global_step": 0, "hyper_parameters": {
        "policies": [{"name": "g", "model": "tiny:gpt2-bpe", "trust_remote_code": True}],
        "reward": "os:system"}}, crafted)
    model_cfg = _parsed(["fit", "--config", str(_cfg(tmp_path)), "--ckpt_path", str(crafted)]).fit.model
    assert model_cfg.reward is None  # the default, not the checkpoint's "os:system"
    assert model_cfg.policies[0].trust_remote_code is False
    err = capsys.readouterr().err
    assert f"checkpoint {str(crafted)!r} carries hyper_parameters (policies, reward)" in err
    assert "did NOT apply them" in err


def test_a_directory_ckpt_path_is_refused_at_once_listing_its_checkpoints(tmp_path):
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    torch.save({"x": 1}, ckpts / "last.ckpt")
    start = time.perf_counter()
    with pytest.raises(IsADirectoryError, match=rf"checkpoint '{ckpts}' is a directory.*'{ckpts}/last\.ckpt'") as e:
        main(["fit", "--config", str(_cfg(tmp_path)), "--ckpt_path", str(ckpts)])
    assert time.perf_counter() - start < 5  # before any model is built
    code, report = reported(e.value, running=False)
    assert code == 2
    one_glance(report, f"checkpoint '{ckpts}' is a directory", f"'{ckpts}/last.ckpt'",
               head="mutual-rl: configuration error: ")


def _fake_last(folder: Path, age_s: float) -> Path:
    folder.mkdir(parents=True)
    path = folder / "last.ckpt"
    torch.save({"state_dict": {}}, path)
    t = time.time() - age_s
    os.utime(path, (t, t))
    return path


def test_ckpt_path_last_finds_the_newest_last_ckpt_across_version_folders(tmp_path, capsys):
    logger = {"class_path": "lightning.pytorch.loggers.CSVLogger",
              "init_args": {"save_dir": str(tmp_path / "logs"), "name": "exp"}}
    _fake_last(tmp_path / "logs" / "exp" / "version_0" / "checkpoints", age_s=100)
    newest = _fake_last(tmp_path / "logs" / "exp" / "version_1" / "checkpoints", age_s=10)
    _fake_last(tmp_path / "logs" / "other" / "version_0" / "checkpoints", age_s=0)  # another run: not this one
    config = _parsed(["fit", "--config", str(_cfg(tmp_path, logger=logger)), "--ckpt_path", "last"])
    assert config.fit.ckpt_path == str(newest)
    assert f"--ckpt_path last -> {newest}" in capsys.readouterr().err


def test_ckpt_path_last_with_nothing_to_resume_and_resume_required_is_an_error_naming_where_it_looked(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no last\.ckpt of this run.*run/checkpoints/last\*\.ckpt") as e:
        main(["fit", "--config", str(_cfg(tmp_path)), "--ckpt_path", "last", "--resume_required", "true"])
    code, report = reported(e.value, running=False)
    assert code == 2
    one_glance(report, "no last.ckpt of this run", "run/checkpoints/last*.ckpt", head="mutual-rl: configuration error: ")


def test_find_last_checkpoint_prefers_model_checkpoint_dirpath(tmp_path):
    from jsonargparse import Namespace

    mine = _fake_last(tmp_path / "mine", age_s=50)
    _fake_last(tmp_path / "run" / "checkpoints", age_s=0)
    cfg = Namespace(default_root_dir=str(tmp_path / "run"), logger=False, callbacks=[
        Namespace(class_path="lightning.pytorch.callbacks.ModelCheckpoint",
                  init_args=Namespace(dirpath=str(tmp_path / "mine"), save_last=True))])
    assert find_last_checkpoint(cfg) == mine
