"""Tables and JSON of the regime comparison (``scripts/compare_regimes.py``), from the runs' TensorBoard scalars.

``report`` writes ``table.md`` (step-0 diagnostics and the benchmark preconditions, held-out pass@1 per policy and
regime, the compute table), ``diagnostics.md``, ``summary.json``, ``compute.json``, ``curves.json`` and the figures
(``compare_plots.py``); ``replot`` redraws the figures from the JSON files alone. ``runs`` maps ``(label, seed)``
to ``[(receiver or None, run folder), ...]``: one folder per label and seed, or for graft_stored one receiver run
per policy, whose ``<policy>/...`` and ``exchange/*-><policy>/...`` series make up that policy's row.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("compare_plots", Path(__file__).resolve().with_name("compare_plots.py"))
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)
mean_std = figures.mean_std

ROOT = Path(__file__).resolve().parents[1]
#: the benchmark preconditions of the GRAFT comparison, checked on the step-0 evaluation
PASS_RANGE, MIN_COMPLEMENTARITY = (0.20, 0.60), 0.30


# ------------------------------------------------------------------------------------------------ reading runs
def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a run, ``tag -> [(step, value), ...]`` in logging order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb" / "version_0"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def per_step(series) -> dict[int, float]:
    """One value per step (the last logged: a resumed run logs the steps after its checkpoint again)."""
    return {int(st): float(v) for st, v in series}


def first_at(series, step: int = 0) -> float | None:
    """The first value logged at ``step`` (at step 0: the evaluation before any training step)."""
    return next((float(v) for st, v in series if st == step), None)


def last_k_mean(series, k: int) -> float:
    vals = [v for step, v in sorted(per_step(series).items()) if step > 0][-k:]
    return sum(vals) / len(vals) if vals else float("nan")


def run_info(run_dir: Path) -> dict:
    """Budget of a run from its config.yaml (rollouts per prompt, prompts per step) and its seconds (done.json)."""
    import yaml

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    done = json.loads((run_dir / "done.json").read_text())
    return {"n": {p["name"]: int(p.get("sampling", {}).get("n", 8)) for p in cfg["model"]["policies"]},
            "batch": int(cfg["data"].get("batch_size", 16)), "seconds": float(done.get("seconds", float("nan")))}


def _own(tag: str, receiver: str, others: set[str]) -> bool | None:
    """Whether ``tag`` of ``receiver``'s run belongs to its row (True), another policy's (False) or is shared."""
    head = tag.split("/", 1)[0]
    if head == receiver:
        return True
    if head in others:
        return False
    if tag.startswith(("exchange/", "complementarity/")) and "->" in tag:
        return tag.split("/")[1].split("->")[-1] == receiver
    return None


def load(runs: dict) -> tuple[dict, dict]:
    """``data[(label, seed)] = scalars`` and ``info[(label, seed)]`` of the finished runs; receiver runs merged."""
    data, info = {}, {}
    for key, parts in runs.items():
        parts = [(r, d) for r, d in parts if (d / "done.json").exists()]
        if not parts:
            continue
        if parts[0][0] is None:
            data[key], info[key] = scalars(parts[0][1]), run_info(parts[0][1])
            continue
        receivers = {r for r, _ in parts}
        merged: dict = {}
        n: dict = {}
        for receiver, d in parts:
            ri = run_info(d)
            n[receiver] = ri["n"][receiver]
            for tag, pts in scalars(d).items():
                own = _own(tag, receiver, receivers - {receiver})
                if own or (own is None and tag not in merged):
                    merged[tag] = pts
        data[key] = merged
        info[key] = {"n": n, "batch": ri["batch"], "receivers": sorted(receivers),
                     "seconds": sum(run_info(d)["seconds"] for _, d in parts)}
    return data, info


def policies_of(data) -> list[str]:
    return sorted({t.split("/")[0] for s in data.values() for t in s if t.endswith("/val/pass@1")})


# ------------------------------------------------------------------------------------------------ step 0
def step0_of(sc: dict) -> dict | None:
    """The step-0 evaluation of one run: pass@1 per policy and, per direction ``A->B`` (A's all-fail held-out
    prompts, B's groups), complementarity, mixed and all-pass shares and counts; None if not logged yet."""
    dirs = sorted(t.split("/")[1] for t in sc if t.startswith("complementarity/") and t.count("/") == 1)
    out = {"pass@1": {}, "directions": {}}
    for d in dirs:
        row = {k: first_at(sc.get(f"complementarity/{d}{suffix}", []))
               for k, suffix in (("complementarity", ""), ("mixed_frac", "/mixed_frac"),
                                 ("all_pass_frac", "/all_pass_frac"), ("all_fail", "/all_fail"), ("solved", "/solved"))}
        if row["complementarity"] is not None:
            out["directions"][d] = row
    if not out["directions"]:
        return None
    for tag, pts in sc.items():
        if tag.endswith("/val/pass@1") and first_at(pts) is not None:
            out["pass@1"][tag.split("/")[0]] = first_at(pts)
    return out


def step0_summary(data: dict, order: list[str]) -> dict | None:
    """Per seed the step-0 evaluation of the first run (in label order) that has one (they share presets and
    evaluation seed), then ``{"seeds", "pass@1": {p: [per seed]}, "directions": {d: {metric: [per seed]}}}``."""
    rank = {lab: i for i, lab in enumerate(order)}
    per_seed: dict = {}
    for (_label, seed), sc in sorted(data.items(), key=lambda kv: (rank.get(kv[0][0], len(rank)), kv[0][1])):
        if seed not in per_seed:
            s0 = step0_of(sc)
            if s0 is not None:
                per_seed[seed] = s0
    if not per_seed:
        return None
    seeds = sorted(per_seed)
    out = {"seeds": seeds, "pass@1": {}, "directions": {}}
    for s in seeds:
        for p, v in per_seed[s]["pass@1"].items():
            out["pass@1"].setdefault(p, []).append(v)
        for d, row in per_seed[s]["directions"].items():
            for k, v in row.items():
                out["directions"].setdefault(d, {}).setdefault(k, []).append(float("nan") if v is None else v)
    return out


def preconditions(s0: dict) -> tuple[bool, list[str]]:
    """Whether each policy's step-0 pass@1 lies in PASS_RANGE and complementarity >= MIN_COMPLEMENTARITY each way."""
    why = []
    for p, vals in sorted(s0["pass@1"].items()):
        m = mean_std(vals)[0]
        if not PASS_RANGE[0] <= m <= PASS_RANGE[1]:
            why.append(f"{p} pass@1 {100 * m:.1f} % is outside [{100 * PASS_RANGE[0]:.0f}, {100 * PASS_RANGE[1]:.0f}] %")
    for d, row in sorted(s0["directions"].items()):
        m = mean_std(row["complementarity"])[0]
        if not m >= MIN_COMPLEMENTARITY:
            why.append(f"complementarity {d} {100 * m:.1f} % < {100 * MIN_COMPLEMENTARITY:.0f} %")
    return not why, why


def _pct(vals) -> str:
    m, sd = mean_std(vals)
    return "n/a" if math.isnan(m) else (f"{100 * m:.1f} %" if len(vals) < 2 else f"{100 * m:.1f} ± {100 * sd:.1f} %")


def _count(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.0f}" if x == int(x) else f"{x:.1f}"


def step0_lines(s0: dict | None) -> list[str]:
    """Markdown lines of the step-0 diagnostics (the same lines are printed)."""
    if s0 is None:
        return ["No step-0 evaluation with complementarity was logged (one policy only, or eval_at_start off).", ""]
    lines = [f"Held-out evaluation before any training step; mean over seeds {s0['seeds']} (± std over seeds). "
             "Direction A->B: A's all-fail held-out prompts (A the receiver), B's groups on them (B the peer).", "",
             "- pass@1 at step 0: " + ", ".join(f"{p} {_pct(v)}" for p, v in sorted(s0["pass@1"].items())),
             "", "| direction A->B | complementarity (B solves) | B's group mixed | B's group all-pass | "
             "A's all-fail prompts | solved by B |", "|---|---|---|---|---|---|"]
    for d, row in sorted(s0["directions"].items()):
        counts = [_count(mean_std(row[k])[0]) for k in ("all_fail", "solved")]
        lines.append(f"| {d} | {_pct(row['complementarity'])} | {_pct(row['mixed_frac'])} | "
                     f"{_pct(row['all_pass_frac'])} | {counts[0]} | {counts[1]} |")
    ok, why = preconditions(s0)
    lines += ["", f"**Benchmark preconditions** (each policy's step-0 pass@1 in [{100 * PASS_RANGE[0]:.0f} %, "
              f"{100 * PASS_RANGE[1]:.0f} %], complementarity >= {100 * MIN_COMPLEMENTARITY:.0f} % in each "
              "direction): " + ("**hold**." if ok else "**do not hold**: " + "; ".join(why) + "."), ""]
    return lines


def print_step0(s0: dict | None) -> None:
    print("[compare] step-0 diagnostics:\n" + "\n".join(f"  {line}" for line in step0_lines(s0) if line),
          flush=True)


def print_step0_if_ready(run_dirs) -> bool:
    """Print the step-0 diagnostics of the first of ``run_dirs`` whose step-0 evaluation is logged; whether any was."""
    for d in run_dirs:
        try:
            sc = scalars(d) if (d / "tb" / "version_0").exists() else {}
        except Exception:  # an event file being written: try again at the next look
            sc = {}
        if step0_of(sc) is not None:
            print(f"[compare] step-0 evaluation of {d.name} (the other runs of this seed start alike):", flush=True)
            print_step0(step0_summary({("run", 0): sc}, ["run"]))
            return True
    return False


# ------------------------------------------------------------------------------------------------ compute
def compute_of(sc: dict, info: dict) -> dict:
    """Per policy, summed over the training steps: rollouts (n x prompts per step + dynamic sampling's extra
    rollouts), generated tokens (``generated_tokens``, else ``response_length`` x n x prompts), trained tokens and
    the policy's own seconds (``gen_s`` + ``train_s``); ``wall_s``: the run's seconds (done.json)."""
    out = {"policies": {}, "wall_s": info["seconds"]}
    for p, n in info["n"].items():
        steps = per_step(sc.get(f"{p}/reward", []))
        if not steps:
            continue
        b = info["batch"]
        extra = sum(per_step(sc.get(f"{p}/dynamic_sampling/extra_rollouts", [])).values())
        if f"{p}/generated_tokens" in sc:
            gen = sum(per_step(sc[f"{p}/generated_tokens"]).values())
        else:
            gen = sum(v * n * b for v in per_step(sc.get(f"{p}/response_length", [])).values())
        secs = sum(per_step(sc.get(f"{p}/gen_s", [])).values()) + sum(per_step(sc.get(f"{p}/train_s", [])).values())
        out["policies"][p] = {"steps": len(steps), "rollouts": n * b * len(steps) + extra, "generated_tokens": gen,
                              "trained_tokens": sum(per_step(sc.get(f"{p}/trained_tokens", [])).values()),
                              "policy_s": secs}
    return out


def compute_all(data: dict, info: dict) -> dict:
    out: dict = {}
    for (label, seed), sc in sorted(data.items()):
        out.setdefault(label, {"seeds": {}})["seeds"][str(seed)] = compute_of(sc, info[(label, seed)])
    return out


COMPUTE_COLS = (("rollouts", "rollouts", "{:.0f}"), ("generated_tokens", "generated tokens", "{:.0f}"),
                ("trained_tokens", "trained tokens", "{:.0f}"), ("policy_s", "gen + train s", "{:.1f}"))


def compute_lines(compute: dict, labels: list[str]) -> list[str]:
    lines = ["Summed over the training steps, mean over seeds. Rollouts = n x prompts per step (+ dynamic "
             "sampling's extra rollouts); generated tokens = every sampled response token (extra rounds included); "
             "trained tokens = tokens the update trained on; 'gen + train s' = the policy's own generation and update "
             "seconds; 'wall s' = the run's seconds, start-up included (a run that builds the warm-started presets "
             "on first use takes longer; graft_stored: its receiver runs, the recording grpo run not included).", "",
             "| regime | policy | " + " | ".join(c[1] for c in COMPUTE_COLS) + " | wall s |",
             "|---|---|" + "---|" * (len(COMPUTE_COLS) + 1)]
    for label in labels:
        seeds = compute.get(label, {}).get("seeds", {})
        if not seeds:
            continue
        pols = sorted({p for s in seeds.values() for p in s["policies"]})
        for p in pols + ["total"]:
            cells = []
            for key, _, fmt in COMPUTE_COLS:
                vals = [sum(x[key] for x in s["policies"].values()) if p == "total" else s["policies"][p][key]
                        for s in seeds.values() if p == "total" or p in s["policies"]]
                cells.append(fmt.format(mean_std(vals)[0]))
            wall = f"{mean_std([s['wall_s'] for s in seeds.values()])[0]:.0f}" if p == "total" else ""
            lines.append(f"| {label} | {p} | " + " | ".join(cells) + f" | {wall} |")
    return lines + [""]


# ------------------------------------------------------------------------------------------------ report
def _beyond_spread(a: list[float], b: list[float]) -> str:
    """'yes' iff |mean(a) - mean(b)| > 2 standard errors of the difference (Welch), over seeds."""
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    if len(a) < 2 or len(b) < 2 or math.isnan(ma) or math.isnan(mb):
        return "n/a (1 seed)"
    se = math.sqrt(sa**2 / len(a) + sb**2 / len(b))
    return "yes" if abs(ma - mb) > 2 * se else "no"


def summarize(args, data, policies, metrics) -> dict:
    summary: dict = {}
    for label in args.regimes:
        seeds = [s for s in args.seeds if (label, s) in data]
        for p in policies:
            for m in metrics:
                have = [s for s in seeds if data[(label, s)].get(f"{p}/val/{m}")]
                if not have:
                    continue
                vals = [last_k_mean(data[(label, s)][f"{p}/val/{m}"], args.last_k) for s in have]
                start = [first_at(data[(label, s)][f"{p}/val/{m}"]) for s in have]
                summary.setdefault(label, {}).setdefault(p, {})[m] = {
                    "values": vals, "seeds": have,
                    "start": mean_std([x for x in start if x is not None])[0]}
    return summary


def write_table(args, root: Path, summary, policies, metrics, s0, compute, info) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    budget = sorted({(i["batch"], n) for i in info.values() for n in i["n"].values()})
    lines = [
        f"# Regime comparison: {args.name}", "",
        f"Commit `{commit}`; command: `python scripts/compare_regimes.py {' '.join(sys.argv[1:])}`.", "",
        f"Held-out pass@1 (k = {args.k} samples at T = 0.6, top-p 0.95; {args.val_per_skill} prompts per skill), "
        f"the mean of the last {args.last_k} evaluations of each run, then mean ± std over seeds "
        f"{list(args.seeds)}; {args.steps} steps; prompts x rollouts per policy and step: "
        f"{', '.join(f'{b} x {n}' for b, n in budget)} (per regime: the compute table). "
        "'beyond spread' = |Δ| > 2 standard errors of the difference over seeds (Welch).", "",
        "## Step-0 diagnostics", "", *step0_lines(s0)]
    for p in policies:
        lines += [f"## {p}", "", "| regime | seeds | " + " | ".join(metrics) + " | Δ pass@1 vs GRPO | beyond spread |",
                  "|---|---|" + "---|" * (len(metrics) + 2)]
        base = summary.get("grpo", {}).get(p, {}).get("pass@1", {}).get("values", [])
        start = next((summary[lab][p]["pass@1"]["start"] for lab in args.regimes
                      if "pass@1" in summary.get(lab, {}).get(p, {})), float("nan"))
        for label in args.regimes:
            row = summary.get(label, {}).get(p)
            if not row or "pass@1" not in row:
                continue
            cells = []
            for m in metrics:
                mu, sd = mean_std(row.get(m, {}).get("values", []))
                cells.append(f"{100 * mu:.1f} ± {100 * sd:.1f}")
            mu, _ = mean_std(row["pass@1"]["values"])
            bmu, _ = mean_std(base)
            delta = f"{100 * (mu - bmu):+.1f}" if label != "grpo" and base else "—"
            spread = _beyond_spread(row["pass@1"]["values"], base) if label != "grpo" and base else "—"
            seeds = len([v for v in row["pass@1"]["values"] if v == v])  # a 1-seed row has no spread ("± 0.0")
            lines.append(f"| {label} | {seeds} | " + " | ".join(cells) + f" | {delta} | {spread} |")
        lines += ["", f"(pass@1 at step 0, before RL: {100 * start:.1f})", ""]
    lines += ["## Compute", "", *compute_lines(compute, args.regimes)]
    (root / "table.md").write_text("\n".join(lines))


#: diagnostics.md: topic -> per-policy tags (mean per training step; ``*_min`` / ``*_max``: min / max over steps);
#: a tag a run lacks whose per-source parts ``<tag>/<source>`` it logs is their sum
DIAG_GROUPS = {
    "Outcomes and updates": ("all_fail_frac", "mixed_frac", "all_pass_frac", "skipped_frac", "nll", "entropy",
                             "approx_kl", "self/approx_kl", "self/clip_frac_low", "self/clip_frac_high",
                             "peer/clip_frac_low", "peer/clip_frac_high"),
    "Transfer (SGT, GRAFT)": ("rescued", "gate_rate", "candidates", "selected", "transferred_groups",
                              "transferred_responses", "admitted_frac"),
    "GRAFT gate by peer outcome and compatibility": (
        "evaluated_success", "evaluated_failure", "admitted_success", "admitted_failure", "admitted_frac_success",
        "admitted_frac_failure", "compat_s_mean", "compat_s_min", "compat_s_max"),
    "F-TIS": ("ftis/peer_rows", "ftis/peer_frac", "ftis/pool_size", "ftis/filtered", "ftis/filtered_frac",
              "ftis/neg_frac", "ftis/peer_adv_mean", "ftis/peer_kl_mean", "ftis/peer_kl_max", "peer/is_weight_mean",
              "peer/is_ratio_mean", "peer/is_trunc_frac"),
    "Dynamic sampling (DAPO)": ("dynamic_sampling/rounds", "dynamic_sampling/extra_prompts",
                                "dynamic_sampling/extra_rollouts", "dynamic_sampling/kept_groups",
                                "dynamic_sampling/dropped_groups", "dynamic_sampling/surplus_groups",
                                "dynamic_sampling/limit_hit"),
}
DIAG = [t for group in DIAG_GROUPS.values() for t in group]


def diag_values(sc: dict, p: str, tag: str) -> list[float]:
    """Per-step values of ``<p>/<tag>`` (or the per-step sum of its per-source parts)."""
    if f"{p}/{tag}" in sc:
        return list(per_step(sc[f"{p}/{tag}"]).values())
    parts = [per_step(v) for t, v in sc.items() if t.startswith(f"{p}/{tag}/") and t.count("/") == tag.count("/") + 2]
    steps = sorted(set().union(*parts)) if parts else []
    return [sum(d.get(st, 0.0) for d in parts) for st in steps]


def write_diagnostics(args, root: Path, data, policies, s0) -> None:
    lines = [f"# Diagnostics: {args.name}", "", "## Step 0", "", *step0_lines(s0),
             "Below: each policy's training metrics, mean per training step over all steps and seeds "
             "(`*_min` / `*_max`: min / max over them); a column no run logged is left out.", ""]
    for topic, tags in DIAG_GROUPS.items():
        cells: dict = {}
        for label in args.regimes:
            for p in policies:
                runs = [data[(label, s)] for s in args.seeds if (label, s) in data]
                for t in tags:
                    vals = [v for sc in runs for v in diag_values(sc, p, t) if v == v]
                    if vals:
                        agg = min(vals) if t.endswith("_min") else max(vals) if t.endswith("_max") else \
                            sum(vals) / len(vals)
                        cells[(label, p, t)] = f"{agg:.3g}"
        cols = [t for t in tags if any(k[2] == t for k in cells)]
        if not cols:
            continue
        lines += [f"## {topic}", "", "| regime | policy | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
        for label in args.regimes:
            for p in policies:
                if any((label, p, t) in cells for t in cols):
                    lines.append(f"| {label} | {p} | " + " | ".join(cells.get((label, p, t), "") for t in cols) + " |")
        lines.append("")
    (root / "diagnostics.md").write_text("\n".join(lines))


def keep_curve(tag: str, policies) -> bool:
    """The series ``curves.json`` keeps: what the per-step figures read."""
    if tag.startswith("exchange/"):
        return "->" in tag and tag.endswith("/consumed")
    if tag.startswith("complementarity/"):
        return tag.count("/") == 1 or tag.endswith(("/mixed_frac", "/all_pass_frac"))
    head, _, rest = tag.partition("/")
    return head in policies and (rest in figures.CURVE_TAGS or rest == "rescued" or rest.startswith("rescued/"))


def write_curves(root: Path, data, policies) -> None:
    """``curves.json``: the per-seed series the plots read, so ``--from-summary`` can redraw them without runs."""
    series: dict = {}
    for (label, seed), sc in sorted(data.items()):
        series.setdefault(label, {})[str(seed)] = {
            t: [[int(st), float(f"{v:.6g}")] for st, v in pts] for t, pts in sorted(sc.items())
            if keep_curve(t, policies)}
    (root / "curves.json").write_text(json.dumps({"policies": policies, "series": series}, separators=(",", ":")))


def report(args, root: Path, runs: dict, order: list[str]) -> None:
    data, info = load(runs)
    if not data:
        raise SystemExit("[compare] no finished runs to report")
    rank = {lab: i for i, lab in enumerate(order)}
    args.regimes = sorted(dict.fromkeys(lab for lab, _ in runs), key=lambda lab: rank.get(lab, len(rank)))
    policies = policies_of(data)
    skills = sorted({t.rsplit("/", 1)[1] for s in data.values() for t in s if "/val/pass@1/" in t})
    metrics = ["pass@1"] + [f"pass@1/{sk}" for sk in skills]
    summary = summarize(args, data, policies, metrics)
    compute = compute_all(data, info)
    s0 = step0_summary(data, order)
    print_step0(s0)
    write_table(args, root, summary, policies, metrics, s0, compute, info)
    write_diagnostics(args, root, data, policies, s0)
    (root / "summary.json").write_text(json.dumps(summary, indent=1))
    (root / "compute.json").write_text(json.dumps(compute, indent=1))
    write_curves(root, data, policies)
    figures.plots(args, root, data, policies)
    figures.rescue_plot(args, root, data, policies)
    figures.final_plot(args, root, summary)
    figures.score_compute_plot(args, root, summary, compute)
    print(f"[compare] wrote {root / 'table.md'} and {root / 'diagnostics.md'}", flush=True)


def replot(args, root: Path, order: list[str]) -> None:
    """Redraw the figures from ``summary.json`` (+ ``compute.json``, ``curves.json`` when present) alone."""
    path = root / "summary.json"
    if not path.exists():
        raise SystemExit(f"[compare] {path} does not exist")
    summary = json.loads(path.read_text())
    rank = {lab: i for i, lab in enumerate(order)}
    args.regimes = sorted(summary, key=lambda lab: rank.get(lab, len(rank)))
    n = max((len(v["values"]) for lab in summary for p in summary[lab] for v in summary[lab][p].values()), default=1)
    figures.final_plot(args, root, summary)
    written = ["pass_at_1_final.png"]
    if (root / "compute.json").exists():
        figures.score_compute_plot(args, root, summary, json.loads((root / "compute.json").read_text()))
        written.append("score_vs_compute.png")
    curves = root / "curves.json"
    if curves.exists():
        blob = json.loads(curves.read_text())
        data = {(lab, int(s)): {t: [tuple(x) for x in pts] for t, pts in sc.items()}
                for lab, by_seed in blob["series"].items() for s, sc in by_seed.items()}
        args.seeds = sorted({s for _, s in data}) or list(range(n))
        figures.plots(args, root, data, blob["policies"])
        figures.rescue_plot(args, root, data, blob["policies"])
        written += ["pass_at_1.png", "entropy_kl.png", "transfers.png", "rescue_complementarity.png"]
    else:
        print(f"[compare] no {curves.name} in {root}: the per-step figures need the runs (--report-only)", flush=True)
    print(f"[compare] wrote {', '.join(str(root / w) for w in written)}", flush=True)
