"""An error of ``mutual-rl`` is one short paragraph, not a traceback: a configuration error (a bad value, a YAML
tab, a ``base:`` loop) prints ``mutual-rl: configuration error: ...`` naming the setting and the config file and
exits 2 (a bad value used to end after ~65 lines of jsonargparse traceback with exit 1, a tab or a loop exited 1);
an error mutual-rl raises on purpose at run time prints ``mutual-rl: error: ...`` and exits 1;
``MUTUAL_RL_DEBUG=1`` shows the traceback. Real ``python -m mutual_rl.cli fit`` subprocesses for those.

jsonargparse's own parse errors -- an unknown key, a value of the wrong type, a missing config file or a folder,
a required setting left out -- used to print the usage line, a tip and jsonargparse's message (``Group 'model' does
not accept option 'algoritm.name'``, ``Parser key "trainer.max_steps": Expected a <class 'int'>. Got value: ten``:
no file, no list position, no accepted values); now one paragraph naming the file (or the command-line flag), the
full key with list positions, what it accepts and the fix, exit 2. Those run in-process as the command
(:func:`tests.reliability.one_glance.command`), the parse being the same in both."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from mutual_rl.cli_errors import MAX_LINES, paragraph
from tests.module.helpers import fit_command, subprocess_env
from tests.reliability.one_glance import command, one_glance, raises

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


def _reported(proc: subprocess.CompletedProcess, *names: str) -> list[str]:
    """The lines from the report's head on (Lightning's seed line may come before it), checked one-glance."""
    return one_glance(proc.stderr, *names).splitlines()


@pytest.mark.parametrize(("policy", "names"), [
    ({"optimizer": {"lr": -1}}, "optimizer.lr must be > 0 (got -1.0)"),
    ({"sampling": {"n": 0, "max_new_tokens": 3}}, "sampling.n"),
])
def test_a_bad_value_is_one_paragraph_naming_the_setting_and_the_file_exit_2(tmp_path, policy, names):
    cfg = _write(tmp_path, policy)
    proc = _fit(cfg, tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = _reported(proc, names, str(cfg))
    assert lines[0].startswith("mutual-rl: configuration error: ") and names in lines[0], proc.stderr
    assert len(lines) <= MAX_LINES and f"(configuration: {cfg})" in lines[-1]
    assert "Traceback" not in proc.stderr and "Union" not in proc.stderr


def test_a_yaml_tab_and_a_base_loop_are_configuration_errors_exit_2(tmp_path):
    tab = _write(tmp_path, text="trainer:\n\tmax_steps: 1\n", name="tab.yaml")
    proc = _fit(tab, tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = _reported(proc, str(tab), "YAML forbids tabs")
    assert lines[0].startswith(f"mutual-rl: configuration error: config {tab}: line 2, column 1") and len(lines) <= 6
    a = _write(tmp_path, text="base: b.yaml\n", name="a.yaml")
    _write(tmp_path, text="base: a.yaml\n", name="b.yaml")
    proc = _fit(a, tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert _reported(proc, str(a), "base:")[0].startswith(f"mutual-rl: configuration error: config {a}: its base: "
                                                          "chain comes back to itself")
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


# -------------------------------------------------------------------------------- jsonargparse's parse errors
P = '{name: g, model: "tiny:gpt2-bpe"}'
MODEL = f"model:\n  policies: [{P}]\n"
PARSE_ERRORS = {  # case: ({file: text}, extra arguments, fragments of the report; {tmp} is the test's folder)
    "unknown key": ({"cfg.yaml": MODEL + "  algoritm: {kl_coef: 0.1}\n"}, [], [
        "config {tmp}/cfg.yaml: model.algoritm is not a setting; did you mean model.algorithm?",
        "Accepted under model: policies, algorithm, regime, reward, evaluation,",
        "Fix: correct the spelling or remove model.algoritm (mutual-rl fit --help lists every setting"]),
    "unknown key in a policy": ({"cfg.yaml": "model:\n  policies: [{name: g, model: x, samplng: {n: 2}}]\n"}, [], [
        "config {tmp}/cfg.yaml: model.policies[0].samplng is not a setting; did you mean model.policies[0].sampling?",
        "Accepted under PolicySpec: name, model, "]),
    "unknown key in the second policy's sampling": (
        {"cfg.yaml": f"model:\n  policies: [{P}, {{name: h, model: x, sampling: {{nn: 2}}}}]\n"}, [], [
            "model.policies[1].sampling.nn is not a setting; did you mean model.policies[1].sampling.n?",
            "Accepted under SamplingSpec: n, temperature, top_p, top_k, max_new_tokens."]),
    "unknown regime argument": ({"cfg.yaml": MODEL + "  regime: {class_path: SGT, init_args: {cof: 0.3}}\n"}, [], [
        "model.regime.init_args.cof is not a setting; did you mean model.regime.init_args.coef?",
        "Accepted under SGT: coef, seed."]),
    "unknown key in a base: file": ({"base.yaml": MODEL + "trainer: {max_step: 3}\n", "cfg.yaml": "base: base.yaml\n"},
                                    [], ["config {tmp}/base.yaml: trainer.max_step is not a setting; did you mean "
                                         "trainer.max_steps?", "Accepted under trainer: "]),
    "unknown key on the command line": ({"cfg.yaml": MODEL}, ["--model.algoritm.kl_coef", "1"], [
        "command line --model.algoritm.kl_coef: model.algoritm is not a setting; did you mean model.algorithm?"]),
    "wrong type": ({"cfg.yaml": MODEL + "trainer: {max_steps: ten}\n"}, [], [
        "config {tmp}/cfg.yaml: trainer.max_steps must be a whole number (int), got 'ten'.",
        "Fix: set trainer.max_steps to a whole number (int) (default: 200)"]),
    "wrong type in the second policy": (
        {"cfg.yaml": f"model:\n  policies: [{P}, {{name: h, model: x, sampling: {{n: two}}}}]\n"}, [], [
            "config {tmp}/cfg.yaml: model.policies[1].sampling.n must be a whole number (int), got 'two'."]),
    "a value not among the choices": ({"cfg.yaml": MODEL + "  reward_errors: ignore\n"}, [], [
        "model.reward_errors must be one of raise, skip, got 'ignore'.", "(default: 'raise')"]),
    "wrong type on the command line": ({"cfg.yaml": MODEL}, ["--trainer.max_steps", "ten"], [
        "command line --trainer.max_steps: trainer.max_steps must be a whole number (int), got 'ten'."]),
    "a class_path that does not import": ({"cfg.yaml": MODEL + "  regime: {class_path: Nope}\n"}, [], [
        "config {tmp}/cfg.yaml: model.regime.class_path 'Nope' is not a class that imports.",
        "Fix: name a Regime subclass by its name or its full import path"]),
    "a missing config file": ({}, [], [
        "config {tmp}/cfg.yaml does not exist ({tmp}/cfg.yaml).", "Fix: give --config the path of a YAML config file"]),
    "a folder as config file": ({"cfg.yaml/x.yaml": MODEL}, [], [
        "config {tmp}/cfg.yaml is a folder, not a config file ({tmp}/cfg.yaml)."]),
    "base: a folder": ({"cfg.yaml": "base: configs\n", "configs/x.yaml": MODEL}, [], [
        "config {tmp}/cfg.yaml: base: configs is a folder ({tmp}/configs), not a config file; give the base "
        "config's path relative to this file"]),
    "base: a missing file": ({"cfg.yaml": "base: nothere.yaml\n"}, [], [
        "config {tmp}/cfg.yaml: base: nothere.yaml is not a file ({tmp}/nothere.yaml does not exist)"]),
    "an empty config file": ({"cfg.yaml": ""}, [], [
        "config {tmp}/cfg.yaml is not a mapping of settings (it is empty or a list)."]),
    "no policies": ({"cfg.yaml": "trainer: {max_steps: 1}\n"}, [], [
        "model.policies must be set and is not (a list of PolicySpec mappings)", "Fix: set model.policies"]),
}


@pytest.mark.parametrize("case", list(PARSE_ERRORS))
def test_a_parse_error_is_one_paragraph_naming_the_file_the_key_the_accepted_values_and_the_fix(
        tmp_path, monkeypatch, capsys, case):
    files, extra, fragments = PARSE_ERRORS[case]
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    code, err = command(monkeypatch, capsys, "fit", "--config", str(tmp_path / "cfg.yaml"), *extra)
    assert code == 2, err
    one_glance(err, *(f.format(tmp=tmp_path) for f in fragments), head="mutual-rl: configuration error: ")
    assert "usage:" not in err and "tip:" not in err and "Parser key" not in err  # jsonargparse's own form


def test_mutual_rl_debug_shows_a_parse_errors_traceback(tmp_path, monkeypatch, capsys):
    import argparse

    (tmp_path / "cfg.yaml").write_text(MODEL + "trainer: {max_steps: ten}\n")
    monkeypatch.setenv("MUTUAL_RL_DEBUG", "1")
    monkeypatch.setattr("sys.argv", ["mutual-rl", "fit", "--config", str(tmp_path / "cfg.yaml")])
    from mutual_rl.cli import main

    with pytest.raises(argparse.ArgumentError, match='Parser key "trainer.max_steps"'):
        main()


def test_the_unit_level_check_fails_on_a_long_or_foreign_error():
    """``one_glance.raises`` (the unit-level catalogue's check) refuses a report cut to fit and an error the
    command would not report as one paragraph (not raised by mutual_rl)."""
    from mutual_rl.exchange import ExchangeProtocolError

    with pytest.raises(AssertionError, match="cut to fit"), raises(ExchangeProtocolError):
        raise ExchangeProtocolError("one line\n" * 10)
    with pytest.raises(BaseException, match="not ours"), raises(ValueError):
        raise ValueError("not ours")  # raised here, not by mutual_rl: the command re-raises it
    with raises(ExchangeProtocolError, "store_dir"):
        raise ExchangeProtocolError("store_dir is in use; pass another")
