"""The real-model pair report (``mutual-rl compare real``): run a ``configs/real/`` config and report it —
held-out accuracy and ``\\boxed{}`` rate before and after, seconds per step, peak memory, and what crossed between
the two policies.

The fit runs in a child process (``mutual-rl fit --config <config> ...``, the comparison's launcher) with its
TensorBoard log under ``<out>/tb``; afterwards the report is read from that log and written to
``<out>/report.json`` and ``<out>/report.md``. ``report_only`` rewrites the report from an existing log, or, when
the log is gone (run folders are not committed), ``report.md`` from ``report.json``; ``plot`` draws every run's
report next to the ``out`` folder into one figure.

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

import json
import resource
import time
from pathlib import Path

from mutual_rl.compare import tags
from mutual_rl.compare.labels import color
from mutual_rl.compare.runner import fit_command, start_fit
from mutual_rl.compare.runs import scalars_with_time

T = tags.PolicyTag


def run_fit(config: Path, out: Path, steps: int | None = None, fit_args: list[str] | tuple[str, ...] = ()) -> dict:
    """Run ``mutual-rl fit --config <config>`` with its log, TensorBoard and export under ``out``; write and
    return ``run.json`` (seconds, peak memory, the command as a user types it)."""
    out.mkdir(parents=True, exist_ok=True)
    extra = [f"--trainer.logger.init_args.save_dir={out}", "--trainer.logger.init_args.name=tb",
             "--trainer.logger.init_args.version=0", f"--model.export_dir={out / 'export'}", *fit_args]
    if steps is not None:
        extra += [f"--trainer.max_steps={steps}", f"--trainer.val_check_interval={steps}"]
    cmd = fit_command(config, *extra)
    print("[real] " + " ".join(cmd), flush=True)
    t0 = time.time()
    code = start_fit(cmd, out / "log.txt", mode="w").wait()
    took = time.time() - t0
    if code != 0:
        raise SystemExit(f"[real] fit failed (exit {code}); see {out / 'log.txt'}")
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # Linux: kilobytes
    shown = ["python", *cmd[1:]]  # the command as a user types it: no machine's interpreter or output paths
    shown = [a.replace(str(out), "<out>") for a in shown]
    info = {"seconds": round(took, 1), "peak_rss_gib": round(peak_kb / 2**20, 2), "command": " ".join(shown)}
    (out / "run.json").write_text(json.dumps(info, indent=1))
    return info


def _mean(series) -> float | None:
    vals = [v for _, v, _ in series if v == v]
    return sum(vals) / len(vals) if vals else None


def report(out: Path) -> dict:
    """``report.json`` and ``report.md`` of the run under ``out`` (from its TensorBoard log)."""
    data = scalars_with_time(out / "tb" / "version_0")
    run = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    policies = sorted({tags.policy_of(t) for t in data if tags.is_pass1(t)})

    def first_last(tag: str) -> tuple[float | None, float | None, int | None]:
        series = sorted(data.get(tag, []))
        if not series:
            return None, None, None
        return series[0][1], series[-1][1], series[-1][0]

    rows = {}
    for p in policies:
        acc0, acc1, at = first_last(tags.policy(p, T.VAL_PASS1))
        box0, box1, _ = first_last(tags.policy(p, T.VAL_BOXED_RATE))
        n = first_last(tags.policy(p, T.VAL_NUM_PROBLEMS))[0]
        rows[p] = {"pass@1_before": acc0, "pass@1_after": acc1, "boxed_rate_before": box0,
                   "boxed_rate_after": box1, "num_problems": n, "after_step": at,
                   "train_reward_mean": _mean(data.get(tags.policy(p, T.REWARD), []))}
    walls = sorted((s, w) for s, _, w in data.get(tags.REWARD, []))
    gaps = [b[1] - a[1] for a, b in zip(walls, walls[1:])]
    crossing = {}
    for recv in policies:
        for src in policies:
            if src == recv:
                continue
            rescued = sum(v for _, v, _ in data.get(tags.rescued(recv, src), []) if v == v)  # NaN: not logged
            prefix = tags.exchange(f"{src}->{recv}")
            flows = {k[len(prefix):]: sum(v for _, v, _ in series if v == v) for k, series in data.items()
                     if k.startswith(prefix)}
            crossing[f"{src}->{recv}"] = {"rescued_prompts": rescued, **flows}
    result = {"policies": rows, "steps": len(walls), "seconds_per_step": _mean([(0, g, 0) for g in gaps]),
              "crossing": crossing, **run}
    (out / "report.json").write_text(json.dumps(result, indent=1))
    (out / "report.md").write_text(markdown(result))
    return result


def rebuild(out: Path) -> dict:
    """``report.md`` from ``report.json`` (no TensorBoard log: run folders are not committed)."""
    result = json.loads((out / "report.json").read_text())
    (out / "report.md").write_text(markdown(result))
    return result


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
    policy, one colour per regime (the comparison's label colours). A run is one seed, so there is no seed band;
    the figure says so."""
    from mutual_rl.compare.plots import pyplot

    plt = pyplot()
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
                ax.bar(x, after, width * 0.9, color=color(name), label=f"{name}: after {r['steps']} steps"
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


def real_pair(config: Path, out: Path, steps: int | None = None, report_only: bool = False,
              plot: Path | None = None, fit_args: list[str] | tuple[str, ...] = ()) -> None:
    """Run + report (or only the report, or only the figure); see the module docstring."""
    if plot is not None:
        dirs = sorted(d for d in out.parent.iterdir() if (d / "report.json").is_file())
        print(plot_reports(dirs, plot))
        return
    if not report_only:
        run_fit(config, out, steps, fit_args)
    if (out / "tb" / "version_0").is_dir():
        result = report(out)
    elif report_only and (out / "report.json").is_file():
        print(f"[real] no TensorBoard log under {out / 'tb'}: {out / 'report.md'} rebuilt from report.json", flush=True)
        result = rebuild(out)
    else:
        raise SystemExit(f"[real] nothing to report: no TensorBoard log under {out / 'tb'} and no report.json")
    print(markdown(result))
