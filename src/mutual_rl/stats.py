"""Typed statistics of the phases of a training step, and how they become logged metrics.

Each phase returns one frozen record instead of a dict of metric names: sampling a :class:`RolloutStats`, scoring a
:class:`ScoringStats`, DAPO dynamic sampling a :class:`DynamicSamplingStats`, an objective a :class:`ObjectiveStats`
per micro-batch, the update loop an :class:`UpdateStats`, a rollout engine's weight sync a :class:`SyncStats`. The
step composes them into its report (:mod:`mutual_rl.step.report`); logging, the reduction over ranks, the stale-value
hygiene and MWRA's accounting read their fields.

Two helpers turn records into metrics, so that the logged names follow the field names and nothing parses a name
back: :func:`flatten` (``{name: float}``; a ``None`` field is absent, a nested record adds its ``prefix``) and
:func:`merge` (several ranks' records into one: fields marked :data:`COUNT` are summed, every other number is the mean
over the records that have it). The logged names are the ones mutual-rl has always written (``entropy``,
``self/clip_frac_low``, ``reward_errors``, ``dynamic_sampling/rounds``, ...).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

#: field metadata of a count: summed over ranks, and 0 (not NaN) on a step that has none
COUNT = {"count": True}


def prefixed(prefix: str, **more: Any) -> dict:
    """Field metadata: the field's own name is replaced by ``prefix`` (a nested record's or a mapping's names follow
    it: ``prefixed("self/")`` logs ``self/clip_frac_low``)."""
    return {"prefix": prefix, **more}


def _logged_fields(record: Any, prefix: str):
    """``(field, value, logged name, prefix of a nested record)`` of each present, logged field of ``record``."""
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if value is not None and f.metadata.get("log") is not False:
            yield f, value, prefix + f.metadata.get("prefix", f.name), prefix + f.metadata.get("prefix", "")


def flatten(record: Any, prefix: str = "") -> dict[str, float]:
    """``{logged name: value}`` of a record (module docstring); a record's ``derived`` properties are included."""
    out: dict[str, float] = {}
    for _, value, name, inner in _logged_fields(record, prefix):
        if dataclasses.is_dataclass(value):
            out.update(flatten(value, inner))
        elif isinstance(value, Mapping):
            out.update({name + k: float(v) for k, v in value.items()})
        else:
            out[name] = float(value)
    for name in getattr(record, "derived", ()):
        value = getattr(record, name)
        if value is not None:
            out[prefix + name] = float(value)
    return out


def count_names(record: Any, prefix: str = "") -> set[str]:
    """The logged names of a record's :data:`COUNT` fields that are present."""
    out: set[str] = set()
    for f, value, name, inner in _logged_fields(record, prefix):
        if dataclasses.is_dataclass(value):
            out |= count_names(value, inner)
        elif f.metadata.get("count"):
            out |= {name + k for k in value} if isinstance(value, Mapping) else {name}
    return out


def merge(records: Sequence[Any]) -> Any:
    """One record from several of the same type (one per rank): per field, :data:`COUNT` fields summed, nested
    records and mappings merged per field and key, every other number the mean over the records that have it
    (``None`` when none has); strings and fields marked ``merge=False`` (e.g. histograms) come from the first record."""
    present = [r for r in records if r is not None]
    if len(present) <= 1:
        return present[0] if present else None
    values = {}
    for f in dataclasses.fields(present[0]):
        vals = [getattr(r, f.name) for r in present]
        keep = f.metadata.get("merge") is False
        values[f.name] = vals[0] if keep else _merge_values(vals, bool(f.metadata.get("count")))
    return dataclasses.replace(present[0], **values)


def _merge_values(values: list, count: bool):
    present = [v for v in values if v is not None]
    if not present:
        return None
    first = present[0]
    if dataclasses.is_dataclass(first):
        return merge(present)
    if isinstance(first, Mapping):
        keys = dict.fromkeys(k for v in present for k in v)
        return {k: _merge_values([v[k] for v in present if k in v], count) for k in keys}
    if isinstance(first, (str, bool)) or not isinstance(first, (int, float, torch.Tensor)):
        return first
    nums = [float(v) for v in present]
    return sum(nums) if count else sum(nums) / len(nums)


# --------------------------------------------------------------------------------------------------- the records
@dataclass(frozen=True)
class RolloutStats:
    """One policy's sampling in a step."""

    generated_tokens: float
    """Response tokens sampled (every rollout, DAPO dynamic sampling's extra rounds included)."""
    gen_s: float
    """Seconds spent sampling them."""
    response_length: float
    """Mean response tokens per rollout of the step's own prompts."""
    eos_frac: float
    """Fraction of those rollouts that ended on EOS (the rest hit max_new_tokens)."""

    derived = ("gen_tokens_per_s",)

    @property
    def gen_tokens_per_s(self) -> float:
        """Response tokens sampled per second of sampling."""
        return self.generated_tokens / max(self.gen_s, 1e-9)


@dataclass(frozen=True)
class ScoringStats:
    """One policy's rewards and group outcomes in a step (of the step's own prompts)."""

    reward: float
    """Mean reward of the rollouts."""
    pass_rate: float
    """Share of the rollouts whose reward is above the success threshold."""
    all_fail_frac: float
    """Share of the groups (one prompt's rollouts) with no success."""
    all_pass_frac: float
    """Share of the groups where every rollout succeeds."""
    mixed_frac: float
    """Share of the groups with both successes and failures (the ones GRPO learns from)."""
    reward_errors: int = field(default=0, metadata=COUNT)
    """Reward calls that failed and were scored 0 (``model.reward_errors: skip``)."""
    reward_timeouts: int = field(default=0, metadata=COUNT)
    """Reward calls that ran past ``model.reward_timeout_s`` and were scored 0."""
    reward_terms: Mapping[str, float] = field(default_factory=dict, metadata=prefixed("reward/", key="<term>"))
    """A weighted list of reward terms: each term's unweighted mean (empty otherwise)."""


@dataclass(frozen=True)
class DynamicSamplingStats:
    """DAPO dynamic sampling of one policy in a step (:mod:`mutual_rl.step.dynamic`)."""

    rounds: int
    """Extra sampling rounds run to fill the batch with mixed groups."""
    extra_prompts: int
    """Prompts drawn in those rounds."""
    extra_rollouts: int
    """Rollouts sampled in those rounds."""
    kept_groups: int
    """Mixed groups trained on (at most the batch's prompts)."""
    dropped_groups: int
    """Groups left out because all their rewards are equal (all fail or all pass)."""
    surplus_groups: int
    """Mixed groups beyond the batch size, not trained on."""
    limit_hit: int
    """1 if the rounds ran out (max_rounds) before the batch was full of mixed groups, else 0."""


@dataclass(frozen=True)
class TokenStats:
    """Statistics of an objective over one set of rows, each a mean over their response tokens (``None``: the
    objective does not compute it). ``num_tokens`` is that count: the weight the update averages with."""

    num_tokens: Any = field(default=0.0, metadata={"log": False})
    entropy: Any = None
    """Token entropy of the policy's distribution (nats)."""
    clip_frac_low: Any = None
    """Share of tokens whose ratio π/π_old is clipped at 1 − ε_low (negative advantage)."""
    clip_frac_high: Any = None
    """Share of tokens whose ratio is clipped at 1 + ε_high (positive advantage)."""
    clip_frac_dual: Any = None
    """Share of tokens with a negative advantage and a ratio above the dual clip bound (0 when it is off)."""
    clip_frac: Any = None
    """HACPO's own rows: share of sequence ratios outside its self clip."""
    ratio_mean: Any = None
    """Mean token ratio π/π_old."""
    approx_kl: Any = None
    """k3 estimate of KL(π_old ‖ π) per token: how far the update moved the policy."""
    kl: Any = None
    """KL to the reference model per token (the penalty's estimator; with kl_coef > 0)."""
    seq_ratio_mean: Any = None
    """HACPO: mean sequence-level (geometric mean) ratio."""
    L_m: Any = None
    """HACPO: the lower clip bound of peer rows this update."""
    is_abs_dev: Any = None
    """Mean |importance ratio − 1| of peer tokens."""
    is_trunc_frac: Any = None
    """Share of peer tokens whose importance weight was truncated at the cap."""
    is_weight_mean: Any = None
    """Mean importance weight of peer tokens (after truncation)."""
    is_ratio_mean: Any = None
    """Mean raw importance ratio of peer tokens (before truncation)."""

    @classmethod
    def pick(cls, values: Mapping[str, Any], prefix: str = "") -> TokenStats:
        """The fields named ``prefix + field`` in an algorithm's output mapping (its documented return names)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k[len(prefix):]: v for k, v in values.items()
                      if k.startswith(prefix) and k[len(prefix):] in names})


@dataclass(frozen=True)
class ObjectiveStats:
    """What an objective reports for one micro-batch: over all its rows, its own rows and its peer rows."""

    rows: TokenStats = field(metadata=prefixed(""))
    own: TokenStats | None = field(default=None, metadata=prefixed("self/"))
    peer: TokenStats | None = field(default=None, metadata=prefixed("peer/"))

    def metrics(self) -> dict[str, float]:
        """The logged names and values (``clip_frac_low``, ``self/ratio_mean``, ``peer/is_weight_mean``, ...)."""
        return flatten(self)

    @classmethod
    def from_algorithm(cls, values: Mapping[str, Any]) -> ObjectiveStats:
        """From the metrics mapping of :mod:`mutual_rl.algorithms`' losses: bare names for all rows, ``self/`` and
        ``peer/`` names for own and peer rows (a part is present when its ``num_tokens`` is)."""
        own = TokenStats.pick(values, "self/") if "self/num_tokens" in values else None
        peer = TokenStats.pick(values, "peer/") if "peer/num_tokens" in values else None
        return cls(rows=TokenStats.pick(values), own=own, peer=peer)


@dataclass(frozen=True)
class UpdateStats:
    """One policy's update in a step (:func:`mutual_rl.update.loop.update_policy`)."""

    trained_tokens: float
    """Response tokens that went through forward/backward."""
    skipped_frac: float
    """Rows whose forward/backward was skipped (zero advantage, no KL)."""
    loss: float | None = None
    """Mean loss over the optimizer steps taken (``None``: the whole update was refused)."""
    grad_norm: float | None = None
    """Mean gradient norm before clipping over the optimizer steps taken."""
    nll: float | None = None
    """Mean NLL of a regime's supervised term (SGT); ``None`` without one."""
    nonfinite_skipped: float | None = None
    """Optimizer steps refused for a non-finite value (``algorithm.on_nonfinite: skip`` only)."""
    tokens: ObjectiveStats | None = field(default=None, metadata=prefixed(""))
    """Token-weighted means of the objective's statistics over the tokens trained (``None``: none was)."""
    lr: float | None = None
    """Learning rate of this step (set by the step)."""
    train_s: float | None = None
    """Seconds of the update (set by the step)."""
    rollout: Any = field(default=None, metadata=prefixed(
        "rollout/", record="mutual_rl.algorithms.rollout_correction:RolloutMismatch"))
    """The engine-vs-trainer mismatch (``algorithms.rollout_correction.RolloutMismatch``; ``None``: not measured)."""

    derived = ("train_tokens_per_s",)

    def metrics(self) -> dict[str, float]:
        """The logged names and values (``loss``, ``entropy``, ``self/approx_kl``, ...)."""
        return flatten(self)

    @property
    def train_tokens_per_s(self) -> float | None:
        """Response tokens trained per second of the update."""
        return None if self.train_s is None else self.trained_tokens / max(self.train_s, 1e-9)


@dataclass(frozen=True)
class ProbeStats:
    """A rollout engine's weight check after a sync: its log-probs against the trainer's on fixed probe texts."""

    probe_gap_mean: float
    """Mean |engine − trainer| log-prob per probe token after the sync (nats)."""
    probe_gap_max: float
    """Largest such gap (nats)."""
    probe_baseline_mean: float
    """The mean gap when the engine was built."""
    probe_moved_mean: float
    """How far the trainer's probe log-probs moved since the engine was built (what a stale engine would show)."""
    probe_followed: float
    """The engine's change over the trainer's since the last checked sync (NaN: too small a change to check)."""
    probe_aligned: float
    """Cosine of the engine's and the trainer's changes since the last checked sync (NaN: too small to check)."""
    probe_change_rms: float
    """Per-token rms change of the trainer's probe log-probs since the last checked sync (nats)."""


@dataclass(frozen=True)
class SyncStats:
    """A weight sync into an engine that holds its own copy of the weights (vLLM)."""

    sync_s: float
    """Seconds of the weight sync into the engine."""
    probe: ProbeStats | None = field(default=None, metadata=prefixed(""))


@dataclass(frozen=True)
class Usage:
    """The resources one policy used in a step on this process (what MWRA accounts)."""

    generated_tokens: float
    gen_s: float
    trained_tokens: float
    train_s: float
    updated: bool


def as_float(value: Any) -> float:
    """A Python float of a number or a one-element tensor."""
    return float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
