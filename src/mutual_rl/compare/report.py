"""Tables and JSON of the regime comparison, from the runs' TensorBoard scalars (or, without runs, from the JSON).

:func:`report` writes, under ``<results>/<name>/``: ``table.md`` (step-0 diagnostics and the benchmark
preconditions; per policy: held-out pass@1, the mean of the last ``last_k`` evaluations, as mean ± std over seeds,
overall and per skill, Δ vs GRPO and whether Δ exceeds the seed spread; the compute table), ``diagnostics.md``,
``summary.json`` (the table's per-seed values), ``compute.json``, ``curves.json`` (the per-seed series the figures
read) and the figures (:mod:`mutual_rl.compare.plots`).

:func:`rebuild` is the same report when the run folders are gone (they are not committed): ``table.md`` from
``summary.json`` and ``compute.json``, the figures from those and ``curves.json``. What those files do not hold is
kept from the existing ``table.md``: everything above the first policy's table (title, commit and command of the
runs' report, the run settings, the step-0 diagnostics, whose all-fail and solved counts no JSON keeps).
``diagnostics.md`` (per-step training metrics no JSON keeps) is left as it is.
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
from pathlib import Path

from mutual_rl.compare import delta, plots, tags
from mutual_rl.compare.claims import claim_lines
from mutual_rl.compare.premise import premise_lines
from mutual_rl.compare.runs import first_at, last_k_mean, load, per_step, policies_of
from mutual_rl.compare.settings import Settings
from mutual_rl.compare.stats import beyond_spread, delta_se, mean_std, min_detectable_difference
from mutual_rl.compare.step0 import print_step0, step0_lines, step0_summary

T = tags.PolicyTag


# ------------------------------------------------------------------------------------------------ compute
def compute_of(sc: dict, info: dict) -> dict:
    """Per policy, summed over the training steps: rollouts (n x prompts per step + dynamic sampling's extra
    rollouts), generated tokens (``generated_tokens``, else ``response_length`` x n x prompts), trained tokens and
    the policy's own seconds (``gen_s`` + ``train_s``); ``wall_s``: the run's seconds (done.json)."""
    out: dict = {"policies": {}, "wall_s": info["seconds"]}

    def total(p: str, metric: str) -> float:
        return sum(per_step(sc.get(tags.policy(p, metric), [])).values())

    for p, n in info["n"].items():
        steps = per_step(sc.get(tags.policy(p, T.REWARD), []))
        if not steps:
            continue
        b = info["batch"]
        if tags.policy(p, T.GENERATED_TOKENS) in sc:
            gen = total(p, T.GENERATED_TOKENS)
        else:
            gen = sum(v * n * b for v in per_step(sc.get(tags.policy(p, T.RESPONSE_LENGTH), [])).values())
        out["policies"][p] = {"steps": len(steps), "rollouts": n * b * len(steps) + total(p, T.EXTRA_ROLLOUTS),
                              "generated_tokens": gen, "trained_tokens": total(p, T.TRAINED_TOKENS),
                              "policy_s": total(p, T.GEN_S) + total(p, T.TRAIN_S)}
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


# ------------------------------------------------------------------------------------------------ table.md
def summarize(s: Settings, data, policies, metrics) -> dict:
    summary: dict = {}
    for label in s.regimes:
        seeds = [seed for seed in s.seeds if (label, seed) in data]
        for p in policies:
            for m in metrics:
                tag = tags.policy(p, f"val/{m}")
                have = [seed for seed in seeds if data[(label, seed)].get(tag)]
                if not have:
                    continue
                vals = [last_k_mean(data[(label, seed)][tag], s.last_k) for seed in have]
                start = [first_at(data[(label, seed)][tag]) for seed in have]
                summary.setdefault(label, {}).setdefault(p, {})[m] = {
                    "values": vals, "seeds": have, "start": mean_std([x for x in start if x is not None])[0]}
    return summary


def commit() -> str:
    """The short commit of the checkout this package runs from ("unknown" for an installed package)."""
    here = Path(__file__).resolve().parent
    res = subprocess.run(["git", "rev-parse", "--show-toplevel", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=here)
    lines = res.stdout.split()
    if res.returncode != 0 or len(lines) != 2 or (Path(lines[0]) / "src" / "mutual_rl").resolve() != here.parent:
        return "unknown"
    return lines[1]


def table_head(s: Settings, s0, info) -> list[str]:
    """Title, commit and command, run settings and the step-0 diagnostics."""
    budget = sorted({(i["batch"], n) for i in info.values() for n in i["n"].values()})
    return [
        f"# Regime comparison: {s.name}", "",
        f"Commit `{commit()}`; command: `{s.command}`; benchmark {getattr(s, 'benchmark', 'v3')}.", "",
        f"Held-out pass@1 (k = {s.k} samples at T = 0.6, top-p 0.95; {s.val_per_skill} prompts per skill), "
        f"the mean of the last {s.last_k} evaluations of each run, then mean ± std over seeds "
        f"{list(s.seeds)}; {s.steps} steps; prompts x rollouts per policy and step: "
        f"{', '.join(f'{b} x {n}' for b, n in budget)} (per regime: the compute table). "
        "'beyond spread' = |Δ| > 2 standard errors of the difference over seeds (Welch).", "",
        "## Step-0 diagnostics", "", *step0_lines(s0)]


def table_body(regimes: list[str], summary: dict, policies, metrics, compute: dict) -> list[str]:
    """One table per policy (pass@1 per regime, overall and per skill, Δ vs GRPO), the papers' orderings checked
    (:mod:`mutual_rl.compare.claims`), then the compute table."""
    lines: list[str] = []
    for p in policies:
        lines += [f"## {p}", "", "| regime | seeds | " + " | ".join(metrics) + " | Δ pass@1 vs GRPO | beyond spread |",
                  "|---|---|" + "---|" * (len(metrics) + 2)]
        base = summary.get("grpo", {}).get(p, {}).get("pass@1", {}).get("values", [])
        start = next((summary[lab][p]["pass@1"]["start"] for lab in regimes
                      if "pass@1" in summary.get(lab, {}).get(p, {})), float("nan"))
        for label in regimes:
            row = summary.get(label, {}).get(p)
            if not row or "pass@1" not in row:
                continue
            cells = []
            for m in metrics:
                mu, sd = mean_std(row.get(m, {}).get("values", []))
                cells.append(f"{100 * mu:.1f} ± {100 * sd:.1f}")
            delta = f"{100 * delta_se(row['pass@1']['values'], base)[0]:+.1f}" if label != "grpo" and base else "—"
            spread = beyond_spread(row["pass@1"]["values"], base) if label != "grpo" and base else "—"
            seeds = len([v for v in row["pass@1"]["values"] if v == v])  # a 1-seed row has no spread ("± 0.0")
            lines.append(f"| {label} | {seeds} | " + " | ".join(cells) + f" | {delta} | {spread} |")
        lines += ["", f"(pass@1 at step 0, before RL: {100 * start:.1f})", ""]
        gain = grpo_gain_text(base, start)
        lines += [gain, ""] if gain else []
    return lines + claim_lines({lab: summary[lab] for lab in regimes if lab in summary}) + \
        ["## Compute", "", *compute_lines(compute, regimes)]


def grpo_gain_text(base: list[float], start: float) -> str:
    """The line under a policy's table: GRPO's own gain (final pass@1 − step 0, mean ± std over seeds) and the
    minimum detectable difference vs GRPO at the same number of seeds per arm, for a regime with GRPO's
    seed-to-seed spread (:func:`~mutual_rl.compare.stats.min_detectable_difference`); empty without a GRPO row."""
    vals = [v for v in base if not math.isnan(v)]
    if not vals or math.isnan(start):
        return ""
    mu, sd = mean_std(vals)
    if len(vals) < 2:
        return f"GRPO's own gain: {100 * (mu - start):+.1f} points (1 seed)."
    n = len(vals)
    mdd = f"{100 * min_detectable_difference(sd, n):.1f} points" if sd > 0 else "n/a (no spread over seeds)"
    return (f"GRPO's own gain: {100 * (mu - start):+.1f} ± {100 * sd:.1f} points over {n} seeds (mean ± std). "
            f"Minimum detectable difference vs GRPO at {n} seeds per arm, for a regime with GRPO's seed-to-seed "
            f"spread: {mdd} (two-sided t-test, α 0.05, power ≈ 0.8; 'beyond spread' is the looser |Δ| > 2 SE).")


# ------------------------------------------------------------------------------------------------ diagnostics
def diag_values(sc: dict, p: str, metric: str) -> list[float]:
    """Per-step values of ``<p>/<metric>`` (or the per-step sum of its per-source parts)."""
    tag = tags.policy(p, metric)
    if tag in sc:
        return list(per_step(sc[tag]).values())
    parts = [per_step(v) for t, v in sc.items() if t.startswith(tag + "/") and t.count("/") == tag.count("/") + 1]
    steps = sorted(set().union(*parts)) if parts else []
    return [sum(d.get(st, 0.0) for d in parts) for st in steps]


def write_diagnostics(s: Settings, root: Path, data, policies, s0, premise: list[str] = ()) -> None:
    lines = [f"# Diagnostics: {s.name}", "", "## Step 0", "", *step0_lines(s0), *premise,
             "Below: each policy's training metrics, mean per training step over all steps and seeds "
             "(`*_min` / `*_max`: min / max over them); a column no run logged is left out.", ""]
    for topic, metrics in tags.DIAG_GROUPS.items():
        cells: dict = {}
        for label in s.regimes:
            for p in policies:
                runs = [data[(label, seed)] for seed in s.seeds if (label, seed) in data]
                for t in metrics:
                    vals = [v for sc in runs for v in diag_values(sc, p, t) if v == v]
                    if vals:
                        agg = min(vals) if t.endswith("_min") else max(vals) if t.endswith("_max") else \
                            sum(vals) / len(vals)
                        cells[(label, p, t)] = f"{agg:.3g}"
        cols = [t for t in metrics if any(k[2] == t for k in cells)]
        if not cols:
            continue
        lines += [f"## {topic}", "", "| regime | policy | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
        for label in s.regimes:
            for p in policies:
                if any((label, p, t) in cells for t in cols):
                    lines.append(f"| {label} | {p} | " + " | ".join(cells.get((label, p, t), "") for t in cols) + " |")
        lines.append("")
    (root / "diagnostics.md").write_text("\n".join(lines))


# ------------------------------------------------------------------------------------------------ JSON files
def keep_curve(tag: str, policies) -> bool:
    """The series ``curves.json`` keeps: what the per-step figures read."""
    if tag.startswith(tags.EXCHANGE + "/"):
        return tags.consumed_flow(tag) is not None
    if tag.startswith(tags.Complementarity.PREFIX + "/"):
        C = tags.Complementarity
        return tag.count("/") == 1 or tag.endswith((f"/{C.MIXED_FRAC}", f"/{C.ALL_PASS_FRAC}"))
    head, _, rest = tag.partition("/")
    return head in policies and (rest in tags.CURVE_TAGS or rest == T.RESCUED or rest.startswith(T.RESCUED + "/"))


def curves_blob(data, policies) -> dict:
    series: dict = {}
    for (label, seed), sc in sorted(data.items()):
        series.setdefault(label, {})[str(seed)] = {
            t: [[int(st), float(f"{v:.6g}")] for st, v in pts] for t, pts in sorted(sc.items())
            if keep_curve(t, policies)}
    return {"policies": policies, "series": series}


def dump(obj, compact: bool = False) -> str:
    """The JSON text of ``summary.json`` / ``compute.json`` (``compact``: ``curves.json``)."""
    return json.dumps(obj, separators=(",", ":")) if compact else json.dumps(obj, indent=1)


def read_curves(root: Path) -> tuple[dict, list[str]] | None:
    """``curves.json`` as ``data[(label, seed)] = {tag: [(step, value), ...]}`` and its policies; None if absent."""
    path = root / "curves.json"
    if not path.exists():
        return None
    blob = json.loads(path.read_text())
    data = {(lab, int(s)): {t: [tuple(x) for x in pts] for t, pts in sc.items()}
            for lab, by_seed in blob["series"].items() for s, sc in by_seed.items()}
    return data, blob["policies"]


# ------------------------------------------------------------------------------------------------ entry points
def _ordered(labels, order: list[str]) -> list[str]:
    rank = {lab: i for i, lab in enumerate(order)}
    return sorted(dict.fromkeys(labels), key=lambda lab: rank.get(lab, len(rank)))


def report(s: Settings, root: Path, runs: dict, order: list[str]) -> None:
    """Every output of the finished runs in ``runs`` (``(label, seed) -> [(receiver, folder), ...]``)."""
    data, info = load(runs)
    if not data:
        raise SystemExit("[compare] no finished runs to report")
    s = copy.copy(s)
    s.regimes = _ordered((lab for lab, _ in runs), order)
    policies = policies_of(data)
    skills = sorted({sk for sc in data.values() for sk in map(tags.skill_of, sc) if sk is not None})
    metrics = ["pass@1"] + [f"pass@1/{sk}" for sk in skills]
    summary = summarize(s, data, policies, metrics)
    compute = compute_all(data, info)
    s0 = step0_summary(data, order)
    print_step0(s0)
    premise = premise_lines(data, order, policies)
    lines = table_head(s, s0, info) + premise + table_body(s.regimes, summary, policies, metrics, compute)
    (root / "table.md").write_text("\n".join(lines))
    write_diagnostics(s, root, data, policies, s0, premise)
    (root / "summary.json").write_text(dump(summary))
    (root / "compute.json").write_text(dump(compute))
    (root / "curves.json").write_text(dump(curves_blob(data, policies), compact=True))
    print(f"[compare] wrote {root / 'table.md'} and {root / 'diagnostics.md'}", flush=True)
    plots.plots(s, root, data, policies)
    plots.rescue_plot(s, root, data, policies)
    delta.delta_plot(s, root, summary)
    plots.final_plot(s, root, summary)
    plots.score_compute_plot(s, root, summary, compute)


def rebuild(s: Settings, root: Path, order: list[str]) -> None:
    """The report without run folders: ``table.md`` from ``summary.json`` + ``compute.json`` (the part above
    the first policy's table kept from the existing ``table.md``), then the figures (:func:`replot`)."""
    summary = json.loads((root / "summary.json").read_text())
    compute_path = root / "compute.json"
    if not compute_path.exists():
        print(f"[compare] {root / 'table.md'} kept as it is: its compute table needs {compute_path.name}, which "
              "this comparison's report did not write", flush=True)
    else:
        compute = json.loads(compute_path.read_text())
        regimes = _ordered([*summary, *compute], order)
        policies = sorted({p for lab in summary for p in summary[lab]})
        metrics = ["pass@1"] + sorted({m for lab in summary for p in summary[lab] for m in summary[lab][p]} - {"pass@1"})
        body = table_body(regimes, summary, policies, metrics, compute)
        table = root / "table.md"
        old = table.read_text() if table.exists() else ""
        cut = old.find(f"\n## {policies[0]}\n") if policies else -1
        head = old[:cut + 1].split("\n")[:-1] if cut >= 0 else json_head(s, root, summary, compute, order)
        table.write_text("\n".join(head + body))
        kept = "the lines above its first policy table kept" if cut >= 0 else "a new head (no earlier table.md)"
        print(f"[compare] no finished runs under {root / 'runs'}: rebuilt {table} from summary.json and "
              f"compute.json ({kept})", flush=True)
    print(f"[compare] {root / 'diagnostics.md'} kept as it is: its per-step training metrics are in no JSON file",
          flush=True)
    replot(s, root, order)


def json_head(s: Settings, root: Path, summary: dict, compute: dict, order: list[str]) -> list[str]:
    """The head of a ``table.md`` rebuilt from JSON with no earlier one: what the JSON holds of the settings and,
    from ``curves.json``, the step-0 diagnostics (their counts are not in it: n/a)."""
    seeds = sorted({sd for lab in summary for p in summary[lab] for cell in summary[lab][p].values()
                    for sd in cell.get("seeds", [])})
    steps = sorted({x["steps"] for lab in compute.values() for run in lab["seeds"].values()
                    for x in run["policies"].values()})
    curves = read_curves(root)
    s0 = step0_summary(curves[0], order) if curves else None
    return [f"# Regime comparison: {s.name}", "",
            f"Rebuilt from summary.json and compute.json at commit `{commit()}` (no run folders); command: "
            f"`{s.command}`.", "",
            f"Held-out pass@1, the mean of the last evaluations of each run, then mean ± std over seeds {seeds}; "
            f"{', '.join(map(str, steps))} steps (the other run settings are not in the JSON files). "
            "'beyond spread' = |Δ| > 2 standard errors of the difference over seeds (Welch).", "",
            "## Step-0 diagnostics", "",
            *(step0_lines(s0) if curves else ["No curves.json: the step-0 diagnostics need the runs.", ""])]


def replot(s: Settings, root: Path, order: list[str]) -> None:
    """Redraw the figures from ``summary.json`` (+ ``compute.json``, ``curves.json`` when present) alone."""
    path = root / "summary.json"
    if not path.exists():
        raise SystemExit(f"[compare] {path} does not exist")
    summary = json.loads(path.read_text())
    s = copy.copy(s)
    s.regimes = _ordered(summary, order)
    n = max((len(v["values"]) for lab in summary for p in summary[lab] for v in summary[lab][p].values()), default=1)
    delta.delta_plot(s, root, summary)
    plots.final_plot(s, root, summary)
    written = ["delta_pass_at_1.png", "pass_at_1_final.png"]
    if (root / "compute.json").exists():
        plots.score_compute_plot(s, root, summary, json.loads((root / "compute.json").read_text()))
        written.append("score_vs_compute.png")
    curves = read_curves(root)
    if curves is not None:
        data, policies = curves
        s.seeds = sorted({seed for _, seed in data}) or list(range(n))
        plots.plots(s, root, data, policies)
        plots.rescue_plot(s, root, data, policies)
        written += ["pass_at_1_curves.png", "entropy_kl.png", "transfers.png", "rescue_complementarity.png"]
    else:
        print(f"[compare] no curves.json in {root}: the per-step figures need the runs (--report-only)", flush=True)
    print(f"[compare] wrote {', '.join(str(root / w) for w in written)}", flush=True)


def has_finished_runs(root: Path) -> bool:
    return any((d / "done.json").exists() for d in (root / "runs").glob("*")) if (root / "runs").is_dir() else False

