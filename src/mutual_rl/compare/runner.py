"""Launching and resuming the comparison's runs: one ``mutual-rl fit`` process per (label, seed).

Every label trains the same pair of tiny heterogeneous policies (``configs/base.yaml``) with the same prompts,
steps and seeds; only the regime (and, for ``grpo_n16`` / ``grpo_n32``, the rollout budget) differs. ``parallel``
runs go at once with ``threads`` torch threads each (on 2 cores, two single-thread runs beat one two-thread run).

``graft_stored`` is GRAFT with stored peers (GRAFT §6.2): the ``grpo`` run of the same seed records its exchange
traffic (``store_dir: <run>/traffic``); then each policy ``P`` is trained alone (``model.policies = [P]``),
regime GRAFT with ``balance: false``, replaying the other policy from that traffic. Those receiver runs wait
until the seed's ``grpo`` run is done (it is scheduled even when ``grpo`` is not a requested label).

Resumable: a finished run leaves ``done.json`` and is skipped; an interrupted one restarts from its
``last.ckpt`` (checkpoints every ``ckpt_every`` steps). Re-running the same command continues where it stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import yaml

from mutual_rl.compare.labels import BENCHMARKS, LABELS, RECORDER, check_configs, config_path, configs_dir
from mutual_rl.compare.settings import ConfigReader, Settings
from mutual_rl.compare.step0 import print_step0_if_ready
from mutual_rl.config_files import merge_config


# ------------------------------------------------------------------------------------------------ the launcher
def fit_command(config: Path, *extra: str) -> list[str]:
    """``mutual-rl fit --config <config> <extra>`` in this interpreter (the command of every run)."""
    return [sys.executable, "-m", "mutual_rl.cli", "fit", "--config", str(config), *extra]


def start_fit(cmd: list[str], log: Path, threads: int | None = None, mode: str = "a") -> subprocess.Popen:
    """Start ``cmd`` with stdout and stderr into ``log`` (appended: a resumed run keeps its earlier log);
    ``threads``: its OMP / MKL thread count (None: this process's environment)."""
    env = dict(os.environ)
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    with open(log, mode) as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)


# ------------------------------------------------------------------------------------------------ the plan
class Job(NamedTuple):
    """One ``mutual-rl fit`` process: a (label, seed), or a graft_stored receiver run of one policy."""

    label: str
    seed: int
    receiver: str | None = None  # graft_stored: the policy trained in this run
    deps: tuple[str, ...] = ()  # names of the runs that must be done first

    @property
    def name(self) -> str:
        return f"{self.label}-{self.receiver}-s{self.seed}" if self.receiver else f"{self.label}-s{self.seed}"


def config_policies(label: str, read: ConfigReader) -> list[str]:
    """The policy names of a label's config (the receivers of a graft_stored comparison)."""
    return [p["name"] for p in read(config_path(label))["model"]["policies"]]


def plan_jobs(labels, seeds, read: ConfigReader) -> list[Job]:
    """The runs to do, in launch-preference order: each seed's labels in order; graft_stored adds one receiver
    run per policy of its config (read by ``read``), depending on that seed's grpo run (added to the plan if
    ``grpo`` is not a label)."""
    jobs: list[Job] = []
    for seed in seeds:
        for label in labels:
            if not LABELS[label].stored:
                jobs.append(Job(label, seed))
                continue
            rec = Job(RECORDER, seed)
            if rec not in jobs:
                jobs.insert(next((i for i, j in enumerate(jobs) if j.seed == seed), len(jobs)), rec)
            jobs += [Job(label, seed, receiver=p, deps=(rec.name,)) for p in config_policies(label, read)]
    return jobs


def run_dirs(labels, seeds, root: Path, read: ConfigReader) -> dict[tuple[str, int], list[tuple[str | None, Path]]]:
    """``(label, seed) -> [(receiver or None, run folder), ...]``: where the report reads each label's runs."""
    out: dict = {}
    for job in plan_jobs(labels, seeds, read):
        if job.label in labels:
            out.setdefault((job.label, job.seed), []).append((job.receiver, root / "runs" / job.name))
    return out


# ------------------------------------------------------------------------------------------------ one run
def run_config(job: Job, s: Settings, run_dir: Path, root: Path) -> dict:
    """The YAML of one run (folder ``run_dir`` of comparison ``root``): the label's config with the seed, budget,
    evaluation set and the label's overrides."""
    spec = LABELS[job.label]
    check_configs([job.label])
    cfg = s.reader()(config_path(job.label))  # the same files, read as `mutual-rl fit --config` reads them
    overlay = BENCHMARKS[s.benchmark]
    if overlay is not None:  # as a second --config: mappings merge, lists (the policies) are replaced
        extra = s.reader()(configs_dir() / overlay)
        cfg = merge_config(cfg, extra)
        if "task" in extra.get("data", {}):  # another task class: replaced whole, not merged field by field
            cfg["data"]["task"] = extra["data"]["task"]
    if spec.regime_args:
        regime = cfg["model"]["regime"]
        regime["init_args"] = {**regime.get("init_args", {}), **dict(spec.regime_args)}
    cfg["seed_everything"] = job.seed
    exchange: dict = {}
    if job.label == RECORDER:
        exchange["store_dir"] = str(run_dir / "traffic")
    cfg["trainer"].update(
        max_steps=s.steps, val_check_interval=s.val_every, enable_progress_bar=False,
        logger={"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                "init_args": {"save_dir": str(run_dir), "name": "tb", "version": 0}},
        callbacks=[
            {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
             "init_args": {"dirpath": str(run_dir / "ckpt"), "every_n_train_steps": s.ckpt_every,
                           "save_last": True, "save_top_k": 1}},
            {"class_path": "mutual_rl.exchange.ExperienceExchange", **({"init_args": exchange} if exchange else {})},
        ],
    )
    model = cfg["model"]
    model.update(export_dir=str(run_dir / "export"), log_samples_every_n_steps=0)
    model["evaluation"] = {**model.get("evaluation", {}), "k": s.k}
    for p in model["policies"]:
        if s.warmstart_steps is not None:
            p["warmstart"] = {**p.get("warmstart", {}), "steps": s.warmstart_steps}
        if s.smoke:
            p["warmstart"] = {**p.get("warmstart", {}), "steps": 10}
            p["sampling"] = {**p.get("sampling", {}), "n": 4}
        if spec.n is not None:
            p["sampling"] = {**p.get("sampling", {}), "n": spec.n}
    cfg["data"].update(seed=job.seed, val_per_skill=s.val_per_skill)
    if s.smoke:
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


def launch(job: Job, s: Settings, root: Path) -> subprocess.Popen | None:
    """Start ``job`` (None if it is done): write its config, resume from its ``last.ckpt`` when there is one."""
    run_dir = root / "runs" / job.name
    if (run_dir / "done.json").exists():
        return None
    if LABELS[job.label].stored:
        check_traffic(root / "runs" / Job(RECORDER, job.seed).name / "traffic", s.steps, job)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = run_config(job, s, run_dir, root)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    last = run_dir / "ckpt" / "last.ckpt"
    if not last.exists():  # a new start: an earlier attempt's recording (it died before its first checkpoint)
        # is set aside, kept, into traffic/superseded-from-step-000000 (a store_dir of another run is refused)
        from mutual_rl.exchange.store import set_aside_steps

        set_aside_steps(run_dir / "traffic", 0)
    cmd = fit_command(run_dir / "config.yaml", *(["--ckpt_path", str(last)] if last.exists() else []))
    proc = start_fit(cmd, run_dir / "log.txt", threads=s.threads)
    proc.job, proc.run_dir, proc.t0 = job, run_dir, time.time()  # type: ignore[attr-defined]
    proc.prior = _elapsed(run_dir)  # seconds of earlier, interrupted attempts  # type: ignore[attr-defined]
    return proc


# ------------------------------------------------------------------------------------------------ all runs
def run_all(s: Settings, root: Path, poll_s: float = 2.0) -> None:
    """Run every planned job not yet done, ``s.parallel`` at a time, each only once its dependencies are done;
    print the step-0 diagnostics once a running comparison run has its step-0 evaluation."""
    jobs = plan_jobs(s.regimes, s.seeds, s.reader())
    is_done = lambda name: (root / "runs" / name / "done.json").exists()  # noqa: E731
    pending = [j for j in jobs if not is_done(j.name)]
    running: list[subprocess.Popen] = []
    done = len(jobs) - len(pending)
    print(f"[compare] {len(jobs)} runs, {done} already done, {s.parallel} at a time", flush=True)
    step0_shown, last_look, started = False, 0.0, []
    while pending or running:
        while len(running) < s.parallel:
            ready = next((j for j in pending if all(is_done(d) for d in j.deps)), None)
            if ready is None:
                break
            pending.remove(ready)
            proc = launch(ready, s, root)
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
            step0_shown = print_step0_if_ready(started)
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
