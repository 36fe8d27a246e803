"""The step-0 diagnostics of a comparison: each policy's held-out pass@1 before any update, the complementarity of
the pair in each direction, and whether the benchmark preconditions of the GRAFT comparison hold."""

from __future__ import annotations

from pathlib import Path

from mutual_rl.compare import tags
from mutual_rl.compare.runs import first_at, scalars
from mutual_rl.compare.stats import count, mean_std, pct

#: the benchmark preconditions of the GRAFT comparison, checked on the step-0 evaluation
PASS_RANGE, MIN_COMPLEMENTARITY = (0.20, 0.60), 0.30


def step0_of(sc: dict) -> dict | None:
    """The step-0 evaluation of one run: pass@1 per policy and, per direction ``A->B`` (A's all-fail held-out
    prompts, B's groups), complementarity, mixed and all-pass shares and counts; None if not logged yet."""
    dirs = sorted(d for d in map(tags.direction_of, sc) if d is not None)
    out: dict = {"pass@1": {}, "directions": {}}
    for d in dirs:
        row = {key: first_at(sc.get(tags.complementarity(d, part), [])) for key, part in tags.STEP0_PARTS}
        if row["complementarity"] is not None:
            out["directions"][d] = row
    if not out["directions"]:
        return None
    for tag, pts in sc.items():
        if tags.is_pass1(tag) and first_at(pts) is not None:
            out["pass@1"][tags.policy_of(tag)] = first_at(pts)
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
    out: dict = {"seeds": seeds, "pass@1": {}, "directions": {}}
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


def step0_lines(s0: dict | None) -> list[str]:
    """Markdown lines of the step-0 diagnostics (the same lines are printed)."""
    if s0 is None:
        return ["No step-0 evaluation with complementarity was logged (one policy only, or eval_at_start off).", ""]
    lines = [f"Held-out evaluation before any training step; mean over seeds {s0['seeds']} (± std over seeds). "
             "Direction A->B: A's all-fail held-out prompts (A the receiver), B's groups on them (B the peer).", "",
             "- pass@1 at step 0: " + ", ".join(f"{p} {pct(v)}" for p, v in sorted(s0["pass@1"].items())),
             "", "| direction A->B | complementarity (B solves) | B's group mixed | B's group all-pass | "
             "A's all-fail prompts | solved by B |", "|---|---|---|---|---|---|"]
    for d, row in sorted(s0["directions"].items()):
        counts = [count(mean_std(row[k])[0]) for k in ("all_fail", "solved")]
        lines.append(f"| {d} | {pct(row['complementarity'])} | {pct(row['mixed_frac'])} | "
                     f"{pct(row['all_pass_frac'])} | {counts[0]} | {counts[1]} |")
    ok, why = preconditions(s0)
    lines += ["", f"**Benchmark preconditions** (each policy's step-0 pass@1 in [{100 * PASS_RANGE[0]:.0f} %, "
              f"{100 * PASS_RANGE[1]:.0f} %], complementarity >= {100 * MIN_COMPLEMENTARITY:.0f} % in each "
              "direction): " + ("**hold**." if ok else "**do not hold**: " + "; ".join(why) + "."), ""]
    return lines


def print_step0(s0: dict | None) -> None:
    print("[compare] step-0 diagnostics:\n" + "\n".join(f"  {line}" for line in step0_lines(s0) if line),
          flush=True)


def print_step0_if_ready(run_dirs: list[Path]) -> bool:
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
