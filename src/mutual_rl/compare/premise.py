"""The measured premises of a comparison, printed beside its verdicts: is each method tested in its regime?

A result measured outside a method's premise is not evidence about the method. Two premises are measured from the
runs themselves (the third, the peer's mixed groups on the receiver's all-fail prompts, is the step-0 table's):

* **Response length**: each policy's mean sampled response length (tokens) at its first training step and over
  the run. GRAFT's gate compares per-token means, so its strictness depends on it (``regimes/graft_gate.py``).
* **GRAFT's gate at step 0**: per receiver (direction peers -> receiver), the share of the evaluated peer successes
  and failures whose compatibility ``s`` exceeds each δ of ``GATE_DELTAS``, and quantiles of ``s``, at the first
  training step of the first GRAFT run of each seed (every GRAFT run of a seed samples the same step-0 rollouts
  from the same presets and scores the same candidates; the grid does not depend on the run's own δ), then
  mean ± std over seeds. The evaluated responses are those of GRAFT's candidate groups (receiver all-fail, peer
  mixed, balanced), before any weighting.
"""

from __future__ import annotations

from mutual_rl.compare import tags
from mutual_rl.compare.runs import per_step
from mutual_rl.compare.stats import mean_std
from mutual_rl.regimes.graft_gate import GATE_DELTAS, KINDS, QUANTILES, admit_tag, quantile_tag

RESPONSE_LENGTH = tags.PolicyTag.RESPONSE_LENGTH


def first_value(series) -> float | None:
    """The value of a training metric at its first logged step (the last one logged there, as ``per_step``)."""
    steps = per_step(series or [])
    return steps[min(steps)] if steps else None


def gate_at_step0(data: dict, order: list[str], policies: list[str]) -> dict:
    """``{receiver: {tag: [value per seed]}, "seeds": [...]}`` of the gate tags at the first training step of the
    first run (in label order) of each seed that logs them."""
    rank = {lab: i for i, lab in enumerate(order)}
    wanted = [admit_tag(k, d) for k in KINDS for d in GATE_DELTAS] + \
        [quantile_tag(k, q) for k in KINDS for q in QUANTILES] + [f"evaluated_{k}" for k in KINDS]
    out: dict = {"seeds": []}
    for (_label, seed), sc in sorted(data.items(), key=lambda kv: (rank.get(kv[0][0], len(rank)), kv[0][1])):
        if seed in out["seeds"] or not any(tags.policy(p, t) in sc for p in policies for t in wanted[:2]):
            continue
        out["seeds"].append(seed)
        for p in policies:
            for t in wanted:
                v = first_value(sc.get(tags.policy(p, t)))
                if v is not None:
                    out.setdefault(p, {}).setdefault(t, []).append(v)
    return out


def _cell(vals: list[float], scale: float = 100.0, fmt: str = ".1f") -> str:
    if not vals:
        return ""
    m, sd = mean_std(vals)
    return f"{scale * m:{fmt}}" + (f" ± {scale * sd:{fmt}}" if len(vals) > 1 else "")


def gate_lines(gate: dict, policies: list[str]) -> list[str]:
    """Markdown: one row per receiver and outcome, the admitted share (%) at each δ and quantiles of ``s``."""
    if not gate.get("seeds") or not any(p in gate for p in policies):
        return ["No GRAFT run logged its gate at several δ (runs before this table existed, or no GRAFT label).", ""]
    head = " | ".join(f"δ {d:g}" for d in GATE_DELTAS)
    qs = " | ".join(f"s p{q}" for q in QUANTILES)
    lines = [f"GRAFT's gate at step 0, seeds {gate['seeds']} (mean ± std over seeds): the share (%) of the peer "
             "responses GRAFT evaluated (candidate groups: receiver all-fail, peer mixed) with compatibility "
             "s > δ, by the peer response's outcome, and quantiles of s.", "",
             f"| receiver | peer outcome | evaluated | {head} | {qs} |",
             "|---|---|---|" + "---|" * (len(GATE_DELTAS) + len(QUANTILES))]
    for p in policies:
        row = gate.get(p, {})
        for k in KINDS:
            if not row.get(admit_tag(k, GATE_DELTAS[0])):
                continue
            adm = " | ".join(_cell(row.get(admit_tag(k, d), [])) for d in GATE_DELTAS)
            qv = " | ".join(_cell(row.get(quantile_tag(k, q), []), 1.0, ".2f") for q in QUANTILES)
            lines.append(f"| {p} | {k} | {_cell(row.get(f'evaluated_{k}', []), 1.0, '.0f')} | {adm} | {qv} |")
    return lines + [""]


def length_lines(data: dict, policies: list[str]) -> list[str]:
    """Markdown: each policy's mean sampled response length (tokens) at its first training step and over the run,
    mean ± std over every run."""
    cells = []
    for p in policies:
        first, overall = [], []
        for sc in data.values():
            series = sc.get(tags.policy(p, RESPONSE_LENGTH))
            if series:
                first.append(first_value(series))
                vals = list(per_step(series).values())
                overall.append(sum(vals) / len(vals))
        if first:
            cells.append(f"{p} {_cell(first, 1.0)} at the first step, {_cell(overall, 1.0)} over the run")
    if not cells:
        return []
    return ["Mean sampled response length (tokens; mean ± std over runs): " + "; ".join(cells) + ".", ""]


def premise_lines(data: dict, order: list[str], policies: list[str]) -> list[str]:
    """The table's "Measured premises" section: response lengths and GRAFT's gate at step 0."""
    return ["## Measured premises", "", *length_lines(data, policies),
            *gate_lines(gate_at_step0(data, order, policies), policies)]
