"""``mutual-rl compare``: its typed arguments with their help, today's spellings, the dispatch before
LightningCLI (``fit`` / ``validate`` unchanged), the console script outside a checkout, and matplotlib imported only
for figures."""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mutual_rl.cli import main
from mutual_rl.compare import cli, plots
from mutual_rl.compare.labels import LABELS
from mutual_rl.compare.settings import Settings

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

#: every option of today's driver, as --help spells it, with a word of its help text
OPTIONS = {
    "--name": "folder under --results", "--regimes": "labels to run and report", "--seeds": "one run per label",
    "--steps": "training steps per run", "--val_every": "held-out evaluation every",
    "--val_per_skill": "held-out prompts per skill", "--k": "samples per held-out prompt",
    "--last_k": "average the last K evaluations", "--ckpt_every": "checkpoint every",
    "--parallel": "runs at once", "--threads": "torch threads per run", "--results": "the results folder",
    "--warmstart_steps": "warm-up steps", "--smoke": "2 steps, 1 seed", "--report_only": "only the report",
    "--from_summary": "only redraw the figures", "--list": "print the labels",
}


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # help wraps lines: compare on single spaces


def test_help_lists_every_argument_with_its_help(capsys):
    text = _help(["compare", "--help"], capsys)
    assert text.startswith("usage: mutual-rl compare")
    listing = text.split(" options: ", 1)[1].split(" examples: ")[0]  # the entries below the usage line
    for option, words in OPTIONS.items():
        at = re.search(rf" {re.escape(option)} (\{{true,false\}}|[A-Z_]+|\[ITEM,\.\.\.\]) ", listing)
        assert at, option
        entry = listing[at.start():][:300]
        assert words in entry, (option, entry)
    assert "(type: int, default: 300)" in text and "(type: tuple[int, ...], default: (0, 1, 2))" in text
    assert "mutual-rl compare real --help" in text and "./results/<name>/" in text
    assert "--command" not in text  # the recorded command line is not an option


def test_default_steps_are_the_benchmarks():
    """`compare`'s default budget is the benchmark's own (configs/base.yaml's trainer.max_steps), in both places."""
    base = yaml.safe_load((CONFIGS / "base.yaml").read_text())
    steps = base["trainer"]["max_steps"]
    assert inspect.signature(cli.compare).parameters["steps"].default == steps == Settings().steps == 300


def test_real_help_lists_its_arguments(capsys):
    text = _help(["compare", "real", "--help"], capsys)
    assert text.startswith("usage: mutual-rl compare real")
    for option, words in {"--config": "a shipped one", "--out": "report.json", "--steps": "trainer.max_steps",
                          "--report_only": "report.md from report.json", "--plot": "into this PNG"}.items():
        assert f" {option} " in text and words in text, option
    assert "--fit_args" not in text and "after `--`" in text


def test_todays_spellings_parse_as_before():
    argv = ["--name", "x", "--regimes", "grpo", "graft_stored", "--seeds", "0", "1", "--val-every", "5",
            "--val-per-skill", "8", "--last-k", "1", "--ckpt-every", "3", "--warmstart-steps", "1500", "--smoke",
            "--report-only", "false", "--replot"]
    parsed = cli.parser_for(cli.compare, "t").parse_args(cli.normalize(argv, cli.compare)).as_dict()
    assert parsed == {"name": "x", "regimes": ("grpo", "graft_stored"), "seeds": (0, 1), "steps": 300,
                      "val_every": 5, "val_per_skill": 8, "k": 8, "last_k": 1, "ckpt_every": 3, "parallel": 2,
                      "threads": 1, "results": "results", "warmstart_steps": 1500, "smoke": True, "benchmark": "v3",
                      "report_only": False, "from_summary": True, "list": False}
    same = cli.normalize(["--seeds=[0,1]", "--regimes", "[grpo]", "--smoke=true"], cli.compare)
    assert same == ["--seeds=[0,1]", "--regimes=[grpo]", "--smoke=true"]


def test_unknown_label_is_one_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="unknown label.*nope.*the labels: grpo, grpo_n16"):
        main(["compare", "--regimes", "grpo", "nope", "--results", str(tmp_path), "--report-only"])


def test_fit_and_validate_still_go_to_lightning(capsys):
    text = _help(["validate", "--help"], capsys)
    assert "--trainer.KEY VALUE" in text and "--ckpt_path" in text and "--list" not in text


def test_console_script_outside_a_checkout(tmp_path):
    """The installed ``mutual-rl`` (this venv's console script), run where there is no configs/ folder."""
    exe = Path(sys.executable).with_name("mutual-rl")
    if not exe.exists():
        pytest.skip(f"no console script next to {sys.executable}")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([str(exe), "compare", "--list"], cwd=tmp_path, capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines()[0].startswith("grpo                 configs/grpo.yaml: GRPO per policy")
    assert len(res.stdout.splitlines()) == len(LABELS) == 23 and not (tmp_path / "results").exists()


def test_matplotlib_only_for_figures(monkeypatch):
    """No module of the comparison imports matplotlib at import time; plots.py imports it when a figure is drawn
    (torchmetrics, which Lightning imports, loads it by itself when it is installed), and without it a figure is an
    ImportError naming the extra."""
    package = Path(plots.__file__).parent
    for path in sorted(package.glob("*.py")):
        for node in ast.parse(path.read_text()).body:  # module level only
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.split(".")[0] == "matplotlib" for n in names), path.name
    inside = [path.name for path in package.glob("*.py") if "import matplotlib" in path.read_text()]
    assert inside == ["plots.py"]
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(ImportError, match=r'figures need matplotlib: pip install "mutual-rl\[plot\]"'):
        plots.pyplot()
