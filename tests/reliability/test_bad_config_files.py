"""Config files as ``--config`` reads them (:mod:`mutual_rl.config_files`): a YAML syntax error (a tab above all) is
one error naming the file, the line and the column; a ``base:`` overlay keeps its relative paths (they resolve
relative to the file they are written in, as without ``base:``); and reading configs leaves no temporary folder."""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile

import pytest
from jsonargparse import ActionConfigFile, ArgumentParser

from mutual_rl.config_files import expand_config_bases, load_config
from mutual_rl.data.datamodule import PromptDataModule
from tests.reliability.one_glance import one_glance, reported


@pytest.fixture(autouse=True)
def _own_tempdir(tmp_path, monkeypatch):
    """Every temporary file or folder Python makes lands in ``tmp_path/tmp`` (checked empty by the tests)."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(sys, "argv", ["mutual-rl"])


def _configs(tmp_path):
    """``cfg/base.yaml``, ``cfg/overlay.yaml`` (``base: base.yaml``, ``data: sub/data.yaml``) and the same overlay
    without ``base:``; the sub-config sits next to them, the command runs from elsewhere."""
    root = tmp_path / "cfg"
    (root / "sub").mkdir(parents=True)
    (root / "base.yaml").write_text("data:\n  batch_size: 5\n  val_batch_size: 7\n")
    (root / "sub" / "data.yaml").write_text("batch_size: 3\n")
    (root / "overlay.yaml").write_text("base: base.yaml\ndata: sub/data.yaml\n")
    (root / "plain.yaml").write_text("data: sub/data.yaml\n")
    return root


def _parser() -> ArgumentParser:
    """jsonargparse as LightningCLI uses it for ``--config``: the data module's arguments, sub-configs allowed."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_class_arguments(PromptDataModule, "data", sub_configs=True)
    return parser


# ------------------------------------------------------------------------------------------- YAML syntax errors
def test_tab_in_a_config_file_names_the_file_line_and_column(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("trainer:\n  max_steps: 3\n\tlogger: false\n")
    with pytest.raises(SystemExit) as err:
        expand_config_bases(["fit", "--config", str(cfg)])
    msg = str(err.value.code)
    assert msg.startswith(f"config {cfg}: line 3, column 1: a tab character: YAML forbids tabs for indentation; "
                          "indent with spaces.")
    assert "\\tlogger: false" in msg  # the line, its tab shown


def test_tab_in_a_base_config_names_the_base_file(tmp_path):
    (tmp_path / "base.yaml").write_text("data:\n\tbatch_size: 4\n")
    (tmp_path / "over.yaml").write_text("base: base.yaml\n")
    with pytest.raises(SystemExit, match=rf"^config {tmp_path / 'base.yaml'}: line 2, column 1: a tab character"):
        expand_config_bases(["fit", f"--config={tmp_path / 'over.yaml'}"])
    with pytest.raises(SystemExit, match=rf"^config {tmp_path / 'base.yaml'}: line 2, column 1: a tab character"):
        load_config(tmp_path / "over.yaml")


def test_other_yaml_errors_name_the_file_line_and_column(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model:\n  policies: [a, b\n")
    with pytest.raises(SystemExit, match=rf"^config {cfg}: line 3, column 1: expected ',' or '\]'"):
        expand_config_bases(["--config", str(cfg)])


@pytest.mark.slow
def test_tab_in_a_config_file_through_the_cli(tmp_path):
    from mutual_rl.cli import main

    cfg = tmp_path / "run.yaml"
    cfg.write_text("trainer:\n\tmax_steps: 1\n")
    with pytest.raises(SystemExit) as err:
        main(["fit", "--config", str(cfg)])
    assert str(err.value.code).startswith(f"config {cfg}: line 2, column 1: a tab character: YAML forbids tabs")
    code, report = reported(err.value, running=False)  # what the mutual-rl command prints for it
    assert code == 2
    one_glance(report, f"mutual-rl: configuration error: config {cfg}: line 2, column 1", "\\tmax_steps: 1")


# ----------------------------------------------------------------------------- base: keeps relative paths
def test_base_overlay_keeps_relative_sub_config_paths(tmp_path, monkeypatch):
    root = _configs(tmp_path)
    monkeypatch.chdir(tmp_path / "tmp")  # not the configs' folder: relative paths must follow the files
    plain = _parser().parse_args(["--config", str(root / "base.yaml"), "--config", str(root / "plain.yaml")])
    assert (plain.data.batch_size, plain.data.val_batch_size) == (3, 7)
    argv = expand_config_bases(["--config", str(root / "overlay.yaml")])
    assert argv == ["--config", str(root / "base.yaml"), "--config", str(root / "overlay.yaml")]  # the files as given
    cfg = _parser().parse_args(argv)  # was: Unable to load config 'sub/data.yaml' (the overlay had moved to /tmp)
    assert (cfg.data.batch_size, cfg.data.val_batch_size) == (3, 7)
    assert "base" not in cfg


def test_base_chain_of_relative_paths_in_other_folders(tmp_path, monkeypatch):
    """A base in another folder, itself an overlay of a third one: each file's paths are its own folder's."""
    root = _configs(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "mine.yaml").write_text("base: ../cfg/overlay.yaml\ndata:\n  val_batch_size: 9\n")
    monkeypatch.chdir(tmp_path / "tmp")
    argv = expand_config_bases(["--config", str(tmp_path / "runs" / "mine.yaml")])
    assert argv[1::2] == [str(root / "base.yaml"), str(root / "overlay.yaml"), str(tmp_path / "runs" / "mine.yaml")]
    cfg = _parser().parse_args(argv)
    assert (cfg.data.batch_size, cfg.data.val_batch_size) == (3, 9)


def test_base_key_is_still_refused_where_no_chain_was_expanded(tmp_path):
    """Only the files whose base: chain was expanded lose the key: a sub-config that says base: is an error."""
    root = _configs(tmp_path)
    (root / "sub" / "data.yaml").write_text("base: nothing.yaml\nbatch_size: 3\n")
    with pytest.raises(Exception, match="Group 'data' does not accept option 'base'"):
        _parser().parse_args(expand_config_bases(["--config", str(root / "overlay.yaml")]))


# ------------------------------------------------------------------------------------- no temporary folders
def test_reading_configs_leaves_no_temporary_folder(tmp_path):
    root = _configs(tmp_path)
    expand_config_bases(["fit", "--config", str(root / "overlay.yaml"), "--config", str(root / "plain.yaml")])
    assert load_config(root / "overlay.yaml")["data"] == "sub/data.yaml"
    assert list((tmp_path / "tmp").iterdir()) == []  # was: one mutual-rl-config-* folder per overlay, never removed


def test_no_temporary_folder_on_error_either(tmp_path):
    root = _configs(tmp_path)
    (root / "broken.yaml").write_text("base: base.yaml\ndata: sub/missing.yaml\n")
    with pytest.raises(Exception, match="missing.yaml"):
        _parser().parse_args(expand_config_bases(["--config", str(root / "broken.yaml")]))
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.slow
def test_base_overlay_through_the_cli(tmp_path, monkeypatch):
    root = _configs(tmp_path)
    (root / "base.yaml").write_text("trainer: {max_steps: 0}\nmodel:\n  policies: [{name: a, model: 'tiny:gpt2-bpe'}]"
                                    "\ndata:\n  batch_size: 5\n  val_batch_size: 7\n")
    monkeypatch.chdir(tmp_path / "tmp")
    from mutual_rl.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as err:
        main(["fit", "--config", str(root / "overlay.yaml"), "--print_config"])
    assert err.value.code == 0
    printed = out.getvalue()
    assert "  batch_size: 3\n" in printed and "  val_batch_size: 7\n" in printed and "base:" not in printed
    assert list((tmp_path / "tmp").iterdir()) == []
