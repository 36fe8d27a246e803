"""Compare sharing regimes under a matched setting (the GRAFT paper's comparison): runs, tables and plots.

Every regime trains the same pair of tiny heterogeneous policies with *complementary* skills (the embedded
benchmark of ``configs/base.yaml``: GPT-2/BPE warm-started on ``+``, Llama/char on ``-``) with the same prompts
(16 per step), steps and seeds; only the regime (and, for ``grpo_n16`` / ``grpo_n32``, the rollout budget)
differs. Each label of :data:`LABELS` names a shipped config (the file ``mutual-rl fit --config`` reads) plus
driver-level overrides. Each (label, seed) is one ``mutual-rl fit`` process; ``--parallel`` of them run at once
with one torch thread each (on 2 cores, two single-thread runs beat one two-thread run).

``graft_stored`` is GRAFT with stored peers (GRAFT §6.2): the ``grpo`` run of the same seed records its exchange
traffic (``store_dir: <run>/traffic``); then each policy ``P`` is trained alone (``model.policies = [P]``),
regime GRAFT with ``balance: false``, replaying the other policy from that traffic (same data seed and batch
size). Those receiver runs wait until the seed's ``grpo`` run is done (it is scheduled even when ``grpo`` is not
in ``--regimes``); ``graft_stored``'s row for ``P`` comes from ``P``'s receiver run.

Resumable: a finished run leaves ``done.json`` and is skipped; an interrupted one restarts from its
``last.ckpt`` (checkpoints every ``--ckpt-every`` steps). Re-running the same command continues where it stopped.

Outputs under ``results/<name>/`` (``scripts/compare_report.py``): ``table.md`` (step-0 diagnostics and whether the
benchmark preconditions hold; per policy: held-out pass@1 — the mean of the last ``--last-k`` evaluations — as
mean ± std over seeds, overall and per skill, Δ vs GRPO and whether Δ exceeds the seed-to-seed spread; the compute
table: rollouts, generated and trained tokens, seconds per policy and total), ``diagnostics.md`` (step 0, then
outcome, transfer, GRAFT gate, F-TIS and dynamic-sampling metrics), ``summary.json`` (the table's per-seed values),
``compute.json``, ``curves.json`` (the per-seed series the figures read) and the figures. The step-0 diagnostics
are also printed as soon as the first run has its step-0 evaluation, and again at report time. Run folders
(``runs/``) are not committed.

Figures (``scripts/compare_plots.py``; one fixed colour per regime in every figure; lines are the mean over seeds,
bands ± 1 std over seeds): ``pass_at_1.png``, ``entropy_kl.png``, ``transfers.png``, ``rescue_complementarity.png``
(rescued prompts per step and held-out complementarity per direction), ``pass_at_1_final.png`` and
``score_vs_compute.png`` (final pass@1 against generated tokens, GRAFT Fig. 3a). ``--from-summary`` redraws them
from ``summary.json``, ``compute.json`` and ``curves.json`` without the runs.

Usage::

    python scripts/compare_regimes.py --name graft_paper               # every label x 3 seeds, 400 steps
    python scripts/compare_regimes.py --name smoke --smoke             # 2 steps, 1 seed, tiny warm-up
    python scripts/compare_regimes.py --name smoke --smoke --regimes grpo graft graft_stored
    python scripts/compare_regimes.py --name graft_paper --report-only  # rebuild tables/plots from finished runs
    python scripts/compare_regimes.py --name graft_paper --from-summary # redraw the figures from the JSON files
    python scripts/compare_regimes.py --name ws1500 --warmstart-steps 1500 --regimes grpo sgt graft --seeds 0
    python scripts/compare_regimes.py --list                           # the labels and what each runs
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import yaml

from mutual_rl.cli import load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def _load(name: str):
    """A sibling script as a module, loaded by path (scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


reporting = _load("compare_report")
figures = reporting.figures
mean_std, plots, final_plot = figures.mean_std, figures.plots, figures.final_plot


class Label(NamedTuple):
    """One row of the comparison: a shipped config plus the driver's overrides."""

    config: str  # a file of configs/ (an overlay of base.yaml), as `mutual-rl fit --config` reads it
    what: str
    n: int | None = None  # every policy's sampling.n (None: the config's; a larger rollout budget)
    stored: bool = False  # GRAFT with stored peers: one receiver run per policy, replaying the seed's grpo run


#: label -> config and overrides; the order is the tables' and figures' order
LABELS: dict[str, Label] = {
    "grpo": Label("grpo.yaml", "GRPO per policy, no sharing (records its exchange traffic for graft_stored)"),
    "grpo_n16": Label("grpo.yaml", "GRPO with 16 rollouts per prompt (larger rollout budget, same steps)", n=16),
    "grpo_n32": Label("grpo.yaml", "GRPO with 32 rollouts per prompt (larger rollout budget, same steps)", n=32),
    "dapo_ds": Label("dapo_ds.yaml", "no sharing, DAPO dynamic sampling (mixed groups only, extra prompts)"),
    "xgrpo": Label("xgrpo.yaml", "XGRPO: reward baseline pooled over the policies"),
    "prp_snapshot": Label("prp.yaml", "PRP, learner-snapshot denominator"),
    "prp_aligned": Label("prp_aligned.yaml", "PRP, THL-aligned peer trace as denominator"),
    "sgt": Label("sgt.yaml", "SGT: NLL on one peer success per all-fail prompt"),
    "hacpo": Label("hacpo.yaml", "HACPO: capability-weighted pooled groups"),
    "ftis": Label("ftis.yaml", "F-TIS: pooled peer samples, truncated IS, KL filter on negative advantages"),
    "graft": Label("graft.yaml", "GRAFT: peer mixed groups replace all-fail groups (co-trained, balanced)"),
    "graft_no_peer_last": Label("graft_no_peer_last.yaml", "GRAFT ablation: no peer-last order"),
    "graft_no_compat": Label("graft_no_compat.yaml", "GRAFT ablation: no compatibility weight (w = 1)"),
    "graft_successes": Label("graft_successes.yaml", "GRAFT ablation: graft only the peer group's successes"),
    "graft_stored": Label("graft.yaml", "GRAFT with stored peers: each policy alone, replaying the grpo run's "
                          "traffic (balance: false)", stored=True),
}
REGIMES: dict[str, str] = {label: spec.config for label, spec in LABELS.items()}  # label -> config file
RECORDER = "grpo"  # the label whose runs record the traffic graft_stored replays


class Job(NamedTuple):
    """One ``mutual-rl fit`` process: a (label, seed), or a graft_stored receiver run of one policy."""

    label: str
    seed: int
    receiver: str | None = None  # graft_stored: the policy trained in this run
    deps: tuple[str, ...] = ()  # names of the runs that must be done first

    @property
    def name(self) -> str:
        return f"{self.label}-{self.receiver}-s{self.seed}" if self.receiver else f"{self.label}-s{self.seed}"


def check_configs(labels) -> None:
    """Every label's config file exists (else one error naming the missing files)."""
    needed = list(labels) + [RECORDER for lab in labels if LABELS[lab].stored]
    missing = sorted({f"{lab}: configs/{LABELS[lab].config}" for lab in needed
                      if not (CONFIGS / LABELS[lab].config).exists()})
    if missing:
        raise SystemExit("[compare] missing config file(s) for the requested labels — " + "; ".join(missing)
                         + ". Create them, or leave those labels out of --regimes.")


def config_policies(label: str) -> list[str]:
    """The policy names of a label's config (the receivers of a graft_stored comparison)."""
    return [p["name"] for p in load_config(CONFIGS / LABELS[label].config)["model"]["policies"]]


def plan_jobs(labels, seeds) -> list[Job]:
    """The runs to do, in launch-preference order: each seed's labels in order; graft_stored adds one receiver
    run per policy, depending on that seed's grpo run (added to the plan if ``grpo`` is not a label)."""
    jobs: list[Job] = []
    for seed in seeds:
        for label in labels:
            if not LABELS[label].stored:
                jobs.append(Job(label, seed))
                continue
            rec = Job(RECORDER, seed)
            if rec not in jobs:
                jobs.insert(next((i for i, j in enumerate(jobs) if j.seed == seed), len(jobs)), rec)
            jobs += [Job(label, seed, receiver=p, deps=(rec.name,)) for p in config_policies(label)]
    return jobs


def run_dirs(labels, seeds, root: Path) -> dict[tuple[str, int], list[tuple[str | None, Path]]]:
    """``(label, seed) -> [(receiver or None, run folder), ...]``: where the report reads each label's runs."""
    out: dict = {}
    for job in plan_jobs(labels, seeds):
        if job.label in labels:
            out.setdefault((job.label, job.seed), []).append((job.receiver, root / "runs" / job.name))
    return out


def run_config(job: Job, args, run_dir: Path, root: Path) -> dict:
    """The YAML of one run (folder ``run_dir`` of comparison ``root``): the label's config with the seed, budget,
    evaluation set and the label's overrides."""
    spec = LABELS[job.label]
    check_configs([job.label])
    cfg = load_config(CONFIGS / spec.config)  # the same files `mutual-rl fit --config` reads
    cfg["seed_everything"] = job.seed
    exchange: dict = {}
    if job.label == RECORDER:
        exchange["store_dir"] = str(run_dir / "traffic")
    cfg["trainer"].update(
        max_steps=args.steps, val_check_interval=args.val_every, enable_progress_bar=False,
        logger={"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                "init_args": {"save_dir": str(run_dir), "name": "tb", "version": 0}},
        callbacks=[
            {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
             "init_args": {"dirpath": str(run_dir / "ckpt"), "every_n_train_steps": args.ckpt_every,
                           "save_last": True, "save_top_k": 1}},
            {"class_path": "mutual_rl.exchange.ExperienceExchange", **({"init_args": exchange} if exchange else {})},
        ],
    )
    model = cfg["model"]
    model.update(export_dir=str(run_dir / "export"), log_samples_every_n_steps=0)
    model["evaluation"] = {**model.get("evaluation", {}), "k": args.k}
    for p in model["policies"]:
        if args.warmstart_steps is not None:
            p["warmstart"] = {**p.get("warmstart", {}), "steps": args.warmstart_steps}
        if args.smoke:
            p["warmstart"] = {**p.get("warmstart", {}), "steps": 10}
            p["sampling"] = {**p.get("sampling", {}), "n": 4}
        if spec.n is not None:
            p["sampling"] = {**p.get("sampling", {}), "n": spec.n}
    cfg["data"].update(seed=job.seed, val_per_skill=args.val_per_skill)
    if args.smoke:
        cfg["data"]["batch_size"] = 4
    if spec.stored:
        _stored_receiver(cfg, job, root)
    return cfg


def _stored_receiver(cfg: dict, job: Job, root: Path) -> None:
    """graft_stored: only ``job.receiver`` is trained; the other policies are replayed from the seed's grpo run."""
    regime = cfg["model"]["regime"]
    if not isinstance(regime, dict) or regime.get("class_path", "").rsplit(".", 1)[-1] != "GRAFT":
        raise SystemExit(f"[compare] {job.label}: configs/{LABELS[job.label].config} does not run GRAFT")
    names = [p["name"] for p in cfg["model"]["policies"]]
    if job.receiver not in names:
        raise SystemExit(f"[compare] {job.name}: no policy {job.receiver!r} in {names}")
    cfg["model"]["policies"] = [p for p in cfg["model"]["policies"] if p["name"] == job.receiver]
    regime["init_args"] = {**regime.get("init_args", {}), "balance": False}
    exchange = cfg["trainer"]["callbacks"][-1]
    exchange["init_args"] = {"replay_dir": str(root / "runs" / Job(RECORDER, job.seed).name / "traffic"),
                             "replay_policies": [n for n in names if n != job.receiver]}


def check_traffic(traffic: Path, steps: int, job: Job) -> None:
    """The recording a graft_stored receiver replays has one step file per training step."""
    from mutual_rl.exchange.store import step_path

    missing = [s for s in range(steps) if not step_path(traffic, s).exists()]
    if missing:
        raise SystemExit(f"[compare] {job.name} replays {traffic}, which lacks {len(missing)} of {steps} step files "
                         f"(first: {step_path(traffic, missing[0]).name}): the {RECORDER} run of seed {job.seed} did not record "
                         "its traffic (it predates store_dir, or ran fewer steps); delete that run folder and re-run.")


def _elapsed(run_dir: Path) -> float:
    path = run_dir / "elapsed.json"
    return float(json.loads(path.read_text())["seconds"]) if path.exists() else 0.0


def launch(job: Job, args, root: Path) -> subprocess.Popen | None:
    run_dir = root / "runs" / job.name
    if (run_dir / "done.json").exists():
        return None
    if LABELS[job.label].stored:
        check_traffic(root / "runs" / Job(RECORDER, job.seed).name / "traffic", args.steps, job)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = run_config(job, args, run_dir, root)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    cmd = [sys.executable, "-m", "mutual_rl.cli", "fit", "--config", str(run_dir / "config.yaml")]
    last = run_dir / "ckpt" / "last.ckpt"
    if last.exists():
        cmd += ["--ckpt_path", str(last)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    log = open(run_dir / "log.txt", "a")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    proc.job, proc.run_dir, proc.t0 = job, run_dir, time.time()  # type: ignore[attr-defined]
    proc.prior = _elapsed(run_dir)  # seconds of earlier, interrupted attempts  # type: ignore[attr-defined]
    return proc


def run_all(args, root: Path, poll_s: float = 2.0) -> None:
    """Run every planned job not yet done, ``args.parallel`` at a time, each only once its dependencies are done;
    print the step-0 diagnostics once a running comparison run has its step-0 evaluation."""
    jobs = plan_jobs(args.regimes, args.seeds)
    is_done = lambda name: (root / "runs" / name / "done.json").exists()  # noqa: E731
    pending = [j for j in jobs if not is_done(j.name)]
    running: list[subprocess.Popen] = []
    done = len(jobs) - len(pending)
    print(f"[compare] {len(jobs)} runs, {done} already done, {args.parallel} at a time", flush=True)
    step0_shown, last_look, started = False, 0.0, []
    while pending or running:
        while len(running) < args.parallel:
            ready = next((j for j in pending if all(is_done(d) for d in j.deps)), None)
            if ready is None:
                break
            pending.remove(ready)
            proc = launch(ready, args, root)
            if proc is not None:
                running.append(proc)
                if ready.receiver is None:
                    started.append(proc.run_dir)
                print(f"[compare] started {ready.name}"
                      + (f" (after {', '.join(ready.deps)})" if ready.deps else ""), flush=True)
        if not running and pending:  # cannot happen when the plan holds every dependency
            raise SystemExit(f"[compare] {pending[0].name} waits for {pending[0].deps}, which no job produces")
        time.sleep(poll_s)
        if not step0_shown and time.time() - last_look > 5:
            last_look = time.time()
            step0_shown = reporting.print_step0_if_ready(started)
        for proc in list(running):
            elapsed = proc.prior + time.time() - proc.t0
            if proc.poll() is None:
                (proc.run_dir / "elapsed.json").write_text(json.dumps({"seconds": round(elapsed, 1)}))
                continue
            running.remove(proc)
            if proc.returncode != 0:
                for other in running:  # the others keep going; their next attempt resumes them
                    print(f"[compare] (still running: {other.job.name})", flush=True)
                raise SystemExit(f"[compare] {proc.job.name} failed (exit {proc.returncode}); "
                                 f"see {proc.run_dir / 'log.txt'}; re-run the same command to resume")
            (proc.run_dir / "done.json").write_text(json.dumps({"seconds": round(elapsed, 1)}))
            (proc.run_dir / "elapsed.json").unlink(missing_ok=True)
            done += 1
            print(f"[compare] finished {proc.job.name} in {elapsed / 60:.1f} min ({done}/{len(jobs)})", flush=True)


def report(args, root: Path) -> None:
    """Tables, JSON and figures of the finished runs of ``args.regimes`` (and of the grpo runs graft_stored
    replays: its reference row)."""
    labels = list(args.regimes)
    if any(LABELS[lab].stored for lab in labels) and RECORDER not in labels:
        labels.insert(0, RECORDER)
    reporting.report(args, root, run_dirs(labels, args.seeds, root), order=list(LABELS))


def replot(args, root: Path) -> None:
    """``--from-summary``: redraw the figures from ``summary.json`` (and ``compute.json`` / ``curves.json``)."""
    reporting.replot(args, root, order=list(LABELS))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", default="embedded")
    ap.add_argument("--regimes", nargs="+", default=list(LABELS), choices=list(LABELS), metavar="LABEL",
                    help=f"labels to run and report (default: all): {', '.join(LABELS)}")
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
                    help="only redraw the figures from results/<name>/summary.json (+ compute.json, curves.json)")
    ap.add_argument("--list", action="store_true", help="print the labels, their configs and overrides, and exit")
    args = ap.parse_args(argv)
    if args.list:
        for label, spec in LABELS.items():
            extra = (f", n = {spec.n}" if spec.n else "") + (", stored peers" if spec.stored else "")
            print(f"{label:20s} configs/{spec.config}{extra}: {spec.what}")
        return
    args.regimes = list(dict.fromkeys(args.regimes))
    if args.smoke:
        args.steps, args.val_every, args.val_per_skill, args.k, args.ckpt_every = 2, 1, 8, 2, 1
        args.seeds = args.seeds[:1]
    root = Path(args.results) / args.name
    if args.from_summary:
        replot(args, root)
        return
    check_configs(args.regimes)
    root.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        run_all(args, root)
    report(args, root)


if __name__ == "__main__":
    main()
