"""``mutual-rl compare``: the regime comparison (labels -> ``mutual-rl fit`` runs -> tables, JSON, figures), and
``mutual-rl compare real``: the real-model pair report.

The options are the parameters of :func:`compare` and :func:`real` (typed, with their help from the docstrings,
parsed by jsonargparse). Today's spellings also work: ``--val-every`` as well as ``--val_every``, lists as
``--seeds 0 1 2`` or ``--seeds [0,1,2]``, flags bare (``--smoke``) or with a value (``--smoke true``).
"""

from __future__ import annotations

import argparse
import inspect
import shlex
import sys
import typing
from pathlib import Path

from jsonargparse import ArgumentParser, DefaultHelpFormatter

from mutual_rl.compare.labels import DEFAULT_LABELS, LABELS, check_configs, describe, resolve_config
from mutual_rl.compare.settings import ConfigReader, Settings
from mutual_rl.compare.stats import require_plot_extra
from mutual_rl.config_files import load_config

USAGE = """examples:
  mutual-rl compare --name graft_paper --steps 200 --val-every 50 --val-per-skill 200   # every label x 3 seeds
  mutual-rl compare --name smoke --smoke --regimes grpo graft graft_stored       # 2 steps, 1 seed, tiny warm-up
  mutual-rl compare --name graft_paper --report-only     # tables + figures from the runs (or, without them, JSON)
  mutual-rl compare --name graft_paper --from-summary    # only the figures, from the JSON files
  mutual-rl compare --list                               # the labels, their configs and overrides
  mutual-rl compare real --help                          # the real-model pair report

Options also take today's spellings: dashes (--val-every), lists space-separated (--seeds 0 1 2), bare flags
(--smoke). Results go to ./results/<name>/ of the current directory (--results to change it); the labels' configs are the
ones shipped in the package (mutual_rl/configs, the repository's configs/)."""


def compare(name: str = "embedded", regimes: tuple[str, ...] | None = None, seeds: tuple[int, ...] = (0, 1, 2),
            steps: int = 300, val_every: int = 100, val_per_skill: int = 400, k: int = 8, last_k: int = 2,
            ckpt_every: int = 50, parallel: int = 2, threads: int = 1, results: str = "results",
            warmstart_steps: int | None = None, smoke: bool = False, benchmark: str = "v3", report_only: bool = False,
            from_summary: bool = False, list: bool = False, *, command: str = "mutual-rl compare",
            read_config: ConfigReader = load_config) -> None:
    """Compare sharing regimes under a matched setting (the GRAFT paper's comparison): runs, tables and figures.

    Every label trains the same pair of tiny heterogeneous policies (configs/base.yaml) with the same prompts,
    steps and seeds; only the regime (and for grpo_n16 / grpo_n32 the rollout budget) differs. Each (label,
    seed) is one `mutual-rl fit` process. Resumable: re-running the same command continues where it stopped.

    Args:
        name: the comparison's folder under --results
        regimes: labels to run and report (default: all; --list shows them)
        seeds: the seeds, one run per label and seed
        steps: training steps per run
        val_every: held-out evaluation every this many steps
        val_per_skill: held-out prompts per skill
        k: samples per held-out prompt (pass@1 over k samples)
        last_k: average the last K evaluations of each run
        ckpt_every: checkpoint every this many steps (an interrupted run resumes from its last)
        parallel: runs at once
        threads: torch threads per run
        results: the results folder (relative: to the current directory)
        warmstart_steps: override both policies' supervised warm-up steps (calibration)
        smoke: 2 steps, 1 seed, tiny warm-up and evaluation
        benchmark: v3 (2-digit arithmetic, the labels' configs as shipped) or v4 (worked solutions: configs/v4.yaml
            merged over every label's config, as `mutual-rl fit --config <label config> --config configs/v4.yaml`)
        report_only: only the report: from the finished runs, or, when there are none, table.md and the figures
            from summary.json, compute.json and curves.json
        from_summary: only redraw the figures from summary.json (+ compute.json, curves.json); also --replot
        list: print the labels, their configs and overrides, and exit
        command: the command line written into table.md (not an option)
        read_config: how a config file is read (default: mutual_rl.config_files.load_config; not an option)
    """
    if list:
        for lab in LABELS.values():
            print(describe(lab))
        return
    from mutual_rl.compare import report, runner

    s = Settings(name=name, regimes=[*(regimes or DEFAULT_LABELS)], seeds=[*seeds], steps=steps, val_every=val_every,
                 val_per_skill=val_per_skill, k=k, last_k=last_k, ckpt_every=ckpt_every, parallel=parallel,
                 threads=threads, results=Path(results), warmstart_steps=warmstart_steps, smoke=smoke,
                 benchmark=benchmark, command=command, read_config=read_config)
    root, order = s.root, [*LABELS]
    if from_summary:
        report.replot(s, root, order)
        return
    if report_only and not report.has_finished_runs(root) and (root / "summary.json").exists():
        report.rebuild(s, root, order)
        return
    check_configs(s.regimes)
    require_plot_extra()
    root.mkdir(parents=True, exist_ok=True)
    if not report_only:
        runner.run_all(s, root)
    labels = [*s.regimes]  # the report also reads the grpo runs graft_stored replays: its reference row
    if any(LABELS[lab].stored for lab in labels) and runner.RECORDER not in labels:
        labels.insert(0, runner.RECORDER)
    report.report(s, root, runner.run_dirs(labels, s.seeds, root, s.reader()), order=order)


def real(config: str = "configs/real/sgt.yaml", out: str = "results/real/sgt", steps: int | None = None,
         report_only: bool = False, plot: str | None = None, *, fit_args: tuple[str, ...] = ()) -> None:
    """Run a configs/real/ config and report it: held-out accuracy and \\boxed{} rate before and after, seconds
    per step, peak memory, and what crossed between the two policies (report.json, report.md under --out).

    More `mutual-rl fit` arguments go after `--`, e.g. `mutual-rl compare real -- --data.batch_size=2`.

    Args:
        config: the config to run: a file, or a shipped one (configs/real/sgt.yaml works outside a checkout)
        out: the run's folder (TensorBoard log, report.json, report.md); relative: to the current directory
        steps: override trainer.max_steps (evaluates at the end)
        report_only: only the report: from the run's log, or, without it, report.md from report.json
        plot: only plot: the report.json of every run folder next to --out (e.g. results/real/grpo and
            results/real/sgt) into this PNG, then exit
        fit_args: more `mutual-rl fit` arguments (given after --; not an option)
    """
    from mutual_rl.compare.real_pair import real_pair

    cfg = resolve_config(config) if plot is None and not report_only else Path(config)
    real_pair(cfg, Path(out).absolute(), steps=steps, report_only=report_only,
              plot=Path(plot) if plot else None, fit_args=fit_args)


class _Formatter(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """jsonargparse's help with the description and examples kept as written."""


def parser_for(fn, prog: str) -> ArgumentParser:
    """The parser of ``fn``'s typed parameters (help from its docstring's ``Args:``)."""
    doc = inspect.getdoc(fn) or ""
    description = doc.split("\n\nArgs:")[0].split("\n    Args:")[0].split("Args:")[0].strip()
    parser = ArgumentParser(prog=prog, description=description, epilog=USAGE if fn is compare else None,
                            formatter_class=_Formatter, exit_on_error=True)
    parser.add_function_arguments(fn, as_group=False, skip={"command", "read_config", "fit_args"})
    return parser


ALIASES = {"replot": "from_summary"}


def normalize(argv: list[str], fn) -> list[str]:
    """Today's spellings as jsonargparse reads them: ``--val-every 5`` -> ``--val_every 5``, ``--seeds 0 1 2`` ->
    ``--seeds=[0, 1, 2]``, a bare ``--smoke`` -> ``--smoke=true``."""
    hints = typing.get_type_hints(fn)
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("--") or token == "--":
            out.append(token)
            continue
        key, eq, value = token[2:].partition("=")
        key = key.replace("-", "_")
        key = ALIASES.get(key, key)
        hint = hints.get(key)
        args = typing.get_args(hint)
        if eq:
            out.append(f"--{key}={value}")
        elif hint is bool:
            if i < len(argv) and argv[i].lower() in ("true", "false"):
                out.append(f"--{key}={argv[i]}")
                i += 1
            else:
                out.append(f"--{key}=true")
        elif typing.get_origin(hint) in (tuple, list) or any(typing.get_origin(a) in (tuple, list) for a in args):
            items = []
            while i < len(argv) and not argv[i].startswith("-"):
                items.append(argv[i])
                i += 1
            one = len(items) == 1 and items[0].startswith("[")
            out.append(f"--{key}={items[0]}" if one else f"--{key}=[{', '.join(items)}]" if items else f"--{key}")
        else:
            out.append(f"--{key}")
    return out


def main(argv: list[str] | None = None, prog: str = "mutual-rl compare", read_config: ConfigReader = load_config) -> None:
    """``mutual-rl compare [options]`` or ``mutual-rl compare real [options] [-- fit arguments]``."""
    argv = [*(sys.argv[1:] if argv is None else argv)]
    if argv[:1] == ["real"]:
        head, fit_args = (argv[1:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv[1:], [])
        cfg = parser_for(real, f"{prog} real").parse_args(normalize(head, real))
        real(**cfg.as_dict(), fit_args=tuple(fit_args))
        return
    cfg = parser_for(compare, prog).parse_args(normalize(argv, compare))
    compare(**cfg.as_dict(), command=shlex.join(["mutual-rl", "compare", *argv]), read_config=read_config)
