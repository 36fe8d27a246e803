"""Reading the comparison's finished runs: their TensorBoard scalars, budget and seconds.

``runs`` maps ``(label, seed)`` to ``[(receiver or None, run folder), ...]``: one folder per label and seed, or
for graft_stored one receiver run per policy, whose ``<policy>/...`` and ``exchange/*-><policy>/...`` series make
up that policy's row (:func:`load` merges them).
"""

from __future__ import annotations

import json
from pathlib import Path

from mutual_rl.compare import tags

Series = list[tuple[int, float]]


def scalars(run_dir: Path) -> dict[str, Series]:
    """Every scalar of a run, ``tag -> [(step, value), ...]`` in logging order."""
    return {tag: [(st, v) for st, v, _ in pts] for tag, pts in scalars_with_time(run_dir / "tb" / "version_0").items()}


def scalars_with_time(tb_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """``tag -> [(step, value, wall_time), ...]`` of one TensorBoard log folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


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
    head = tags.policy_of(tag)
    if head == receiver:
        return True
    if head in others:
        return False
    flow = tags.flow_of(tag)
    if flow is not None:
        return flow.split("->")[-1] == receiver
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
    return sorted({tags.policy_of(t) for s in data.values() for t in s if tags.is_pass1(t)})
