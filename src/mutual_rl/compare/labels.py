"""The labels of the regime comparison, each in one record: its shipped config, the driver's overrides, and how
every figure draws it (colour, line style, marker).

The configs are the files ``mutual-rl fit --config`` reads, shipped inside the package (``mutual_rl/configs``, the
repository's top-level ``configs/`` folder, packaged as data), so the comparison runs from an installed wheel as
well as from a checkout.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path


@dataclass(frozen=True)
class Label:
    """One row of the comparison: a shipped config plus the driver's overrides and the label's drawing style."""

    name: str
    config: str
    """a file of the shipped configs (an overlay of ``base.yaml``), as ``mutual-rl fit --config`` reads it"""
    what: str
    """one line: what the label runs"""
    color: str
    """its colour in every figure"""
    marker: str
    """its marker in the per-regime scatter figures (score vs compute)"""
    style: str = "-"
    """its line style (the no-sharing baselines dashed, the GRAFT ablations dotted / dash-dotted)"""
    n: int | None = None
    """every policy's ``sampling.n`` (None: the config's; a larger rollout budget)"""
    stored: bool = False
    """GRAFT with stored peers: one receiver run per policy, replaying the seed's recorded run"""
    regime_args: tuple[tuple[str, object], ...] = ()
    """``model.regime.init_args`` set over the config's (e.g. ``(("delta", 0.5),)``: GRAFT at another δ)"""


_TABLE = (
    Label("grpo", "grpo.yaml", "GRPO per policy, no sharing (records its exchange traffic for graft_stored)",
          "#404040", "o", "--"),
    Label("grpo_n16", "grpo.yaml", "GRPO with 16 rollouts per prompt (larger rollout budget, same steps)",
          "#8c8c8c", "o", "-.", n=16),
    Label("grpo_n32", "grpo.yaml", "GRPO with 32 rollouts per prompt (larger rollout budget, same steps)",
          "#000000", "o", ":", n=32),
    Label("dapo_ds", "dapo_ds.yaml", "no sharing, DAPO dynamic sampling (mixed groups only, extra prompts)",
          "#bcbd22", "s", "--"),
    Label("xgrpo", "xgrpo.yaml", "XGRPO: reward baseline pooled over the policies", "#1f77b4", "^"),
    Label("prp_snapshot", "prp.yaml", "PRP, learner-snapshot denominator", "#ff7f0e", "v"),
    Label("prp_aligned", "prp_aligned.yaml", "PRP, THL-aligned peer trace as denominator", "#8c564b", "<"),
    Label("prp_span", "prp_aligned.yaml", "PRP, aligned peer trace at span granularity (exact on the shipped pairs; "
          "word moves 42-80 % of a trace's mass off its characters, scripts/thl_granularity.py)", "#c49c94", "<", ":",
          regime_args=(("granularity", "span"),)),
    Label("sgt", "sgt.yaml", "SGT: NLL on one peer success per all-fail prompt", "#2ca02c", "D"),
    Label("sgt_lam01", "sgt.yaml", "SGT at λ = 0.1 (the paper's value; λ per update)", "#74c476", "D", ":",
          regime_args=(("coef", 0.1),)),
    Label("sgt_lam03", "sgt.yaml", "SGT at λ = 0.3 (the tiny-scale calibration before λ per update)", "#006d2c",
          "D", "-.", regime_args=(("coef", 0.3),)),
    Label("hacpo", "hacpo.yaml", "HACPO: capability-weighted pooled groups", "#d62728", ">"),
    Label("ftis", "ftis.yaml", "F-TIS: pooled peer samples, truncated IS, KL filter on negative advantages",
          "#e377c2", "P"),
    Label("graft", "graft.yaml", "GRAFT: peer mixed groups replace all-fail groups (co-trained, balanced)",
          "#9467bd", "*"),
    Label("graft_d09", "graft.yaml", "GRAFT at δ = 0.9 (v4: the δ at which the gate selects; measured premises)",
          "#3182bd", "*", "-.", regime_args=(("delta", 0.9),)),
    Label("graft_d05", "graft.yaml", "GRAFT at δ = 0.5 (v3: a gate that admits more; measured premises)",
          "#6a3d9a", "*", "--", regime_args=(("delta", 0.5),)),
    Label("graft_d03", "graft.yaml", "GRAFT at δ = 0.3 (a permissive gate)", "#cab2d6", "*", ":",
          regime_args=(("delta", 0.3),)),
    Label("graft_no_peer_last", "graft_no_peer_last.yaml", "GRAFT ablation: no peer-last order",
          "#17becf", "X", ":"),
    Label("graft_no_compat", "graft_no_compat.yaml", "GRAFT ablation: no compatibility weight (w = 1)",
          "#f2b701", "h", "-."),
    Label("graft_successes", "graft_successes.yaml", "GRAFT ablation: graft only the peer group's successes",
          "#3f007d", "p", ":"),
    Label("graft_hacpo_rule", "graft_hacpo_rule.yaml", "GRAFT §6.3: GRAFT's prompt selection, HACPO's update rule",
          "#aec7e8", "8", "--"),
    Label("graft_sgt_rule", "graft_sgt_rule.yaml", "GRAFT §6.3: GRAFT's prompt selection, SGT's update rule",
          "#98df8a", "H", "--"),
    Label("graft_stored", "graft.yaml", "GRAFT with stored peers: each policy alone, replaying the grpo run's "
          "traffic (balance: false)", "#00a087", "d", stored=True),
)

#: label -> its record; the order is the tables' and figures' order
LABELS: dict[str, Label] = {lab.name: lab for lab in _TABLE}
#: labels run only when named in --regimes: GRAFT at other δ (chosen on benchmark v4), SGT at a fixed λ, PRP's
#: aligned trace at span granularity
EXTRA_LABELS = ("graft_d09", "graft_d05", "graft_d03", "sgt_lam01", "sgt_lam03", "prp_span")
#: the labels a comparison runs when --regimes is not given
DEFAULT_LABELS = tuple(lab for lab in LABELS if lab not in EXTRA_LABELS)

#: benchmark -> the overlay merged over every label's config (None: the labels' configs as they are)
BENCHMARKS: dict[str, str | None] = {"v3": None, "v4": "v4.yaml"}
RECORDER = "grpo"
"""the label whose runs record the exchange traffic graft_stored replays"""
DEFAULT_COLOR, DEFAULT_MARKER, DEFAULT_STYLE = "#17becf", "o", "-"  # a name that is no label (a real-pair run)


def configs_dir() -> Path:
    """The shipped configs: ``mutual_rl/configs`` of the installed package (in a checkout: a link to the
    repository's ``configs/``)."""
    path = Path(str(files("mutual_rl") / "configs"))
    if not path.is_dir():
        raise SystemExit(f"[compare] the shipped configs are missing: {path} is not a folder (a broken install? "
                         "reinstall mutual-rl)")
    return path


def config_path(label: str) -> Path:
    """The shipped config file of ``label``."""
    return configs_dir() / LABELS[label].config


def resolve_config(path: str | Path) -> Path:
    """A config given on the command line: the file if it exists, else the shipped one of that name
    (``configs/real/sgt.yaml`` or ``real/sgt.yaml``), so the README's commands run outside a checkout too."""
    p = Path(path)
    if p.is_file():
        return p.absolute()
    rel = p.parts[1:] if p.parts[:1] == ("configs",) else p.parts
    shipped = configs_dir().joinpath(*rel) if rel and not p.is_absolute() else None
    if shipped is not None and shipped.is_file():
        return shipped
    raise SystemExit(f"[compare] config {path}: no such file, and no shipped config of that name in {configs_dir()}")


def check_configs(labels) -> None:
    """Every label's config file exists (else one error naming the missing files)."""
    needed = list(labels) + [RECORDER for lab in labels if LABELS[lab].stored]
    missing = sorted({f"{lab}: configs/{LABELS[lab].config}" for lab in needed if not config_path(lab).exists()})
    if missing:
        raise SystemExit("[compare] missing config file(s) for the requested labels — " + "; ".join(missing)
                         + ". Create them, or leave those labels out of --regimes.")


def color(name: str) -> str:
    """The colour of a label in every figure (a fixed fallback for any other name)."""
    lab = LABELS.get(name)
    return lab.color if lab else DEFAULT_COLOR


def style(name: str) -> str:
    lab = LABELS.get(name)
    return lab.style if lab else DEFAULT_STYLE


def marker(name: str) -> str:
    lab = LABELS.get(name)
    return lab.marker if lab else DEFAULT_MARKER


def describe(lab: Label) -> str:
    """One line of ``mutual-rl compare --list``."""
    extra = (f", n = {lab.n}" if lab.n else "") + (", stored peers" if lab.stored else "") + \
        "".join(f", {k} = {v}" for k, v in lab.regime_args)
    return f"{lab.name:20s} configs/{lab.config}{extra}: {lab.what}"
