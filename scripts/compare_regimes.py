"""Compare sharing regimes under a matched budget: runs, table and plots (resumable).

Every regime trains the same pair of tiny heterogeneous policies with *complementary* skills (the embedded
benchmark of ``configs/sgt.yaml``: GPT-2/BPE warm-started on ``+``, Llama/char on ``-``) with the same rollout
budget (n = 8 per prompt, 16 prompts per step), the same number of steps and the same seeds; only the regime
differs. Each (regime, seed) is one ``mutual-rl fit`` process; ``--parallel`` of them run at once with one torch
thread each (on 2 cores, two single-thread runs beat one two-thread run).

Resumable: a finished run leaves ``done.json`` and is skipped; an interrupted one restarts from its
``last.ckpt`` (checkpoints every ``--ckpt-every`` steps). Re-running the same command continues where it stopped.

Outputs under ``results/<name>/``: ``table.md`` (per policy: held-out pass@1 — the mean of the last ``--last-k``
evaluations — as mean ± std over seeds, overall and per skill, Δ vs GRPO and whether Δ exceeds the seed-to-seed
spread), ``diagnostics.md`` (gate rates, admitted fractions, transfers, clip fractions, KL), ``summary.json`` (the
table's per-seed values), ``curves.json`` (the per-seed series the figures read) and the figures. Run folders
(``runs/``) are not committed.

Figures (``scripts/compare_plots.py``; one fixed colour per regime in every figure; lines are the mean over seeds, bands ± 1 std over seeds):
``pass_at_1.png`` (held-out pass@1 per evaluation), ``entropy_kl.png`` (token entropy and the approx. KL to the
behaviour policy on *own* rows, ``self/approx_kl``, on a log scale: the all-rows ``approx_kl`` of PRP
``peer_aligned`` measures peer tokens against the peer trace and does not compare; runs that predate
``self/approx_kl`` fall back to ``approx_kl`` and the panel title says so), ``transfers.png`` (cumulative peer
responses consumed per direction, log scale) and ``pass_at_1_final.png`` (end-of-run pass@1 per regime, seeds as
dots, mean ± std, step-0 value). ``--from-summary`` redraws them from ``summary.json`` (and ``curves.json`` when
present) without the runs.

Usage::

    python scripts/compare_regimes.py --name embedded                 # 7 regimes x 3 seeds, 400 steps
    python scripts/compare_regimes.py --name smoke --smoke            # 2 steps, 1 seed, tiny warm-up
    python scripts/compare_regimes.py --name embedded --report-only   # rebuild table/plots from finished runs
    python scripts/compare_regimes.py --name embedded --from-summary  # redraw the figures from summary/curves.json
    python scripts/compare_regimes.py --name ws1500 --warmstart-steps 1500 --regimes grpo sgt graft --seeds 0
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from mutual_rl.cli import load_config

ROOT = Path(__file__).resolve().parents[1]

# the figures live next to this script (scripts/compare_plots.py); loaded by path, as scripts are not a package
_spec = importlib.util.spec_from_file_location("compare_plots", Path(__file__).resolve().with_name("compare_plots.py"))
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)
mean_std, plots, final_plot, CURVE_TAGS = figures.mean_std, figures.plots, figures.final_plot, figures.CURVE_TAGS

#: regime label -> the shipped config it runs (an overlay of configs/base.yaml: regime and its algorithm settings)
REGIMES: dict[str, str] = {
    "grpo": "grpo.yaml",
    "xgrpo": "xgrpo.yaml",
    "prp_snapshot": "prp.yaml",
    "prp_aligned": "prp_aligned.yaml",
    "sgt": "sgt.yaml",
    "graft": "graft.yaml",
    "hacpo": "hacpo.yaml",
}


def run_config(label: str, seed: int, args, run_dir: Path) -> dict:
    """The YAML of one run: the base config with the regime, seed, budget and evaluation set."""
    cfg = load_config(ROOT / "configs" / REGIMES[label])  # the same files `mutual-rl fit --config` reads
    cfg["seed_everything"] = seed
    cfg["trainer"].update(
        max_steps=args.steps, val_check_interval=args.val_every, enable_progress_bar=False,
        logger={"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                "init_args": {"save_dir": str(run_dir), "name": "tb", "version": 0}},
        callbacks=[
            {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
             "init_args": {"dirpath": str(run_dir / "ckpt"), "every_n_train_steps": args.ckpt_every,
                           "save_last": True, "save_top_k": 1}},
            {"class_path": "mutual_rl.exchange.ExperienceExchange"},
        ],
    )
    model = cfg["model"]
    model.update(export_dir=str(run_dir / "export"),
                 log_samples_every_n_steps=0)
    model["evaluation"] = {**model.get("evaluation", {}), "k": args.k}
    if args.warmstart_steps is not None:
        for p in model["policies"]:
            p["warmstart"] = {**p.get("warmstart", {}), "steps": args.warmstart_steps}
    if args.smoke:
        for p in model["policies"]:
            p["warmstart"] = {**p.get("warmstart", {}), "steps": 10}
            p["sampling"] = {**p.get("sampling", {}), "n": 4}
    cfg["data"].update(seed=seed, val_per_skill=args.val_per_skill)
    if args.smoke:
        cfg["data"]["batch_size"] = 4
    return cfg


def launch(label: str, seed: int, args, root: Path) -> subprocess.Popen | None:
    run_dir = root / "runs" / f"{label}-s{seed}"
    if (run_dir / "done.json").exists():
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(run_config(label, seed, args, run_dir), sort_keys=False))
    cmd = [sys.executable, "-m", "mutual_rl.cli", "fit", "--config", str(run_dir / "config.yaml")]
    last = run_dir / "ckpt" / "last.ckpt"
    if last.exists():
        cmd += ["--ckpt_path", str(last)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    log = open(run_dir / "log.txt", "a")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    proc.run_dir, proc.label, proc.seed, proc.t0 = run_dir, label, seed, time.time()  # type: ignore[attr-defined]
    return proc


def run_all(args, root: Path) -> None:
    todo = [(label, seed) for seed in args.seeds for label in args.regimes]
    running: list[subprocess.Popen] = []
    done = sum((root / "runs" / f"{lab}-s{s}" / "done.json").exists() for lab, s in todo)
    print(f"[compare] {len(todo)} runs, {done} already done, {args.parallel} at a time", flush=True)
    while todo or running:
        while todo and len(running) < args.parallel:
            label, seed = todo.pop(0)
            proc = launch(label, seed, args, root)
            if proc is not None:
                running.append(proc)
                print(f"[compare] started {label} seed {seed}", flush=True)
        time.sleep(2)
        for proc in list(running):
            if proc.poll() is None:
                continue
            running.remove(proc)
            took = time.time() - proc.t0
            if proc.returncode != 0:
                raise SystemExit(f"[compare] {proc.label} seed {proc.seed} failed (exit {proc.returncode}); "
                                 f"see {proc.run_dir / 'log.txt'}; re-run the same command to resume")
            (proc.run_dir / "done.json").write_text(json.dumps({"seconds": round(took, 1)}))
            done += 1
            print(f"[compare] finished {proc.label} seed {proc.seed} in {took / 60:.1f} min "
                  f"({done}/{done + len(todo) + len(running)})", flush=True)


# ------------------------------------------------------------------------------------------------ reporting
def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb" / "version_0"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def last_k_mean(series: list[tuple[int, float]], k: int) -> float:
    vals = [v for step, v in sorted(series) if step > 0][-k:]
    return sum(vals) / len(vals) if vals else float("nan")


def report(args, root: Path) -> None:
    data = {}
    for label in args.regimes:
        for seed in args.seeds:
            run_dir = root / "runs" / f"{label}-s{seed}"
            if (run_dir / "done.json").exists():
                data[(label, seed)] = scalars(run_dir)
    if not data:
        raise SystemExit("[compare] no finished runs to report")
    DATA.clear()
    DATA.update(data)
    policies = sorted({t.split("/")[0] for s in data.values() for t in s if t.endswith("/val/pass@1")})
    skills = sorted({t.rsplit("/", 1)[1] for s in data.values() for t in s if "/val/pass@1/" in t})
    metrics = ["pass@1"] + [f"pass@1/{sk}" for sk in skills]
    summary: dict = {}
    for label in args.regimes:
        for p in policies:
            for m in metrics:
                vals = [last_k_mean(data[(label, s)].get(f"{p}/val/{m}", []), args.last_k)
                        for s in args.seeds if (label, s) in data]
                start = [last_k_mean([(1, v) for st, v in data[(label, s)].get(f"{p}/val/{m}", []) if st == 0], 1)
                         for s in args.seeds if (label, s) in data]
                summary.setdefault(label, {}).setdefault(p, {})[m] = {"values": vals, "start": mean_std(start)[0]}
    write_table(args, root, summary, policies, metrics)
    write_diagnostics(args, root, data, policies)
    (root / "summary.json").write_text(json.dumps(summary, indent=1))
    write_curves(args, root, data, policies)
    plots(args, root, data, policies)
    final_plot(args, root, summary)
    print(f"[compare] wrote {root / 'table.md'}", flush=True)


DATA: dict = {}  # (label, seed) -> scalars, for the report writers


def _beyond_spread(a: list[float], b: list[float]) -> str:
    """'yes' iff |mean(a) - mean(b)| > 2 standard errors of the difference (Welch), over seeds."""
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    if len(a) < 2 or len(b) < 2 or math.isnan(ma) or math.isnan(mb):
        return "n/a (1 seed)"
    se = math.sqrt(sa**2 / len(a) + sb**2 / len(b))
    return "yes" if abs(ma - mb) > 2 * se else "no"


def write_table(args, root: Path, summary, policies, metrics) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    lines = [
        f"# Regime comparison: {args.name}", "",
        f"Commit `{commit}`; command: `python scripts/compare_regimes.py {' '.join(sys.argv[1:])}`.", "",
        f"Held-out pass@1 (k = {args.k} samples at T = 0.6, top-p 0.95; {args.val_per_skill} prompts per skill), "
        f"the mean of the last {args.last_k} evaluations of each run, then mean ± std over seeds "
        f"{list(args.seeds)}; {args.steps} steps, 16 prompts x 8 rollouts per policy and step. "
        "'beyond spread' = |Δ| > 2 standard errors of the difference over seeds (Welch).", "",
    ]
    for p in policies:
        lines += [f"## {p}", "", "| regime | " + " | ".join(metrics) + " | Δ pass@1 vs GRPO | beyond spread |",
                  "|---|" + "---|" * (len(metrics) + 2)]
        base = summary.get("grpo", {}).get(p, {}).get("pass@1", {}).get("values", [])
        start = summary.get("grpo", {}).get(p, {}).get("pass@1", {}).get("start", float("nan"))
        for label in args.regimes:
            row = summary.get(label, {}).get(p)
            if not row:
                continue
            cells = []
            for m in metrics:
                mu, sd = mean_std(row[m]["values"])
                cells.append(f"{100 * mu:.1f} ± {100 * sd:.1f}")
            mu, _ = mean_std(row["pass@1"]["values"])
            bmu, _ = mean_std(base)
            delta = f"{100 * (mu - bmu):+.1f}" if label != "grpo" and base else "—"
            spread = _beyond_spread(row["pass@1"]["values"], base) if label != "grpo" and base else "—"
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {delta} | {spread} |")
        lines += ["", f"(pass@1 at step 0, before RL: {100 * start:.1f})", ""]
    comp = sorted({t for (lab, _), sc in DATA.items() for t in sc if t.startswith("complementarity/")
                   and t.count("/") == 1})
    if comp:
        lines += ["## Complementarity (share of A's all-fail held-out prompts that B solves, at step 0)", ""]
        for tag in comp:
            vals = [v for (lab, _), sc in DATA.items() for st, v in sc.get(tag, []) if st == 0]
            lines.append(f"- {tag.split('/', 1)[1]}: {100 * sum(vals) / len(vals):.1f} %")
        lines.append("")
    (root / "table.md").write_text("\n".join(lines))


DIAG = ["all_fail_frac", "rescued", "gate_rate", "admitted_frac", "transferred_responses", "peer/clip_frac_low",
        "peer/clip_frac_high", "self/clip_frac_low", "self/clip_frac_high", "nll", "entropy", "approx_kl",
        "self/approx_kl"]


def write_diagnostics(args, root: Path, data, policies) -> None:
    lines = ["# Diagnostics (mean over all training steps and seeds)", "",
             "| regime | policy | " + " | ".join(DIAG) + " |", "|---|---|" + "---|" * len(DIAG)]
    for label in args.regimes:
        for p in policies:
            cells = []
            for d in DIAG:
                vals = [v for s in args.seeds if (label, s) in data for _, v in data[(label, s)].get(f"{p}/{d}", [])]
                cells.append(f"{sum(vals) / len(vals):.3g}" if vals else "")
            lines.append(f"| {label} | {p} | " + " | ".join(cells) + " |")
    (root / "diagnostics.md").write_text("\n".join(lines) + "\n")


def write_curves(args, root: Path, data, policies) -> None:
    """``curves.json``: the per-seed series the plots read, so ``--from-summary`` can redraw them without runs."""
    def keep(tag: str) -> bool:
        if tag.startswith("exchange/"):
            return "->" in tag and tag.endswith("/consumed")
        return any(tag == f"{p}/{t}" for p in policies for t in CURVE_TAGS)

    series: dict = {}
    for (label, seed), sc in sorted(data.items()):
        series.setdefault(label, {})[str(seed)] = {
            t: [[int(st), float(f"{v:.6g}")] for st, v in sorted(pts)] for t, pts in sorted(sc.items()) if keep(t)}
    (root / "curves.json").write_text(json.dumps({"policies": policies, "series": series}, separators=(",", ":")))


def replot(args, root: Path) -> None:
    """``--from-summary``: redraw the figures from ``summary.json`` (and ``curves.json`` when present) alone."""
    path = root / "summary.json"
    if not path.exists():
        raise SystemExit(f"[compare] {path} does not exist")
    summary = json.loads(path.read_text())
    known = [lab for lab in args.regimes if lab in summary]
    args.regimes = known + [lab for lab in summary if lab not in known]
    n = max((len(v["values"]) for lab in summary for p in summary[lab] for v in summary[lab][p].values()), default=1)
    final_plot(args, root, summary)
    written = ["pass_at_1_final.png"]
    curves = root / "curves.json"
    if curves.exists():
        blob = json.loads(curves.read_text())
        data = {(lab, int(s)): {t: [tuple(x) for x in pts] for t, pts in sc.items()}
                for lab, by_seed in blob["series"].items() for s, sc in by_seed.items()}
        args.seeds = sorted({s for _, s in data}) or list(range(n))
        plots(args, root, data, blob["policies"])
        written += ["pass_at_1.png", "entropy_kl.png", "transfers.png"]
    else:
        print(f"[compare] no {curves.name} in {root}: the per-step figures need the runs (--report-only)", flush=True)
    print(f"[compare] wrote {', '.join(str(root / w) for w in written)}", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", default="embedded")
    ap.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--val-every", type=int, default=100)
    ap.add_argument("--val-per-skill", type=int, default=400)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--last-k", type=int, default=2, help="average the last K evaluations of each run")
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--results", default=str(ROOT / "results"))
    ap.add_argument("--warmstart-steps", type=int, default=None,
                    help="override both policies' supervised warm-up steps (calibration; see calibrate_warmstart.py)")
    ap.add_argument("--smoke", action="store_true", help="2 steps, 1 seed, tiny warm-up and evaluation")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--from-summary", "--replot", dest="from_summary", action="store_true",
                    help="only redraw the figures from results/<name>/summary.json (and curves.json), no runs")
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.val_every, args.val_per_skill, args.k, args.ckpt_every = 2, 1, 8, 2, 1
        args.seeds = args.seeds[:1]
    root = Path(args.results) / args.name
    if args.from_summary:
        replot(args, root)
        return
    root.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        run_all(args, root)
    report(args, root)


if __name__ == "__main__":
    main()
