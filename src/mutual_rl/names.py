"""The logged names that are not fields of a typed record: composed here, and only here.

Most of what a step logs is a field of a typed record (:mod:`mutual_rl.stats`, a regime's statistics record), named
by :func:`mutual_rl.stats.flatten` after the field. The rest -- the run-level reward, the exchange's flow counts, the
THL residuals, the held-out evaluation, MWRA's accounting -- is keyed by policies, flows, skills or drop reasons that
only the run knows; those names are composed by the functions below, which their producers call, and each family is
described once in :data:`FAMILIES`. :mod:`mutual_rl.catalogue` joins both into the list of everything logged
(docs/metrics.md is generated from it) and :mod:`mutual_rl.compare.tags` reads its tags from here.

Placeholders in a template: ``<policy>`` (a policy's name), ``<source>`` (a peer that sent the responses),
``<receiver>``, ``<skill>`` (a held-out skill), ``<k>`` (samples per held-out prompt), ``<reason>``
(:class:`DropReason`), ``<field>`` (one of the listed parts).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

RUN_REWARD = "reward"
"""The mean reward over the policies (one per step; the progress bar's ``reward``)."""
VAL_MEAN = "val_pass@1"
"""The mean held-out pass@1 over the policies (one per evaluation; the progress bar's ``val_pass@1``)."""


class DropReason(str, Enum):
    """Why a delivered peer response was not trained on (``exchange/<source>-><receiver>/dropped/<reason>``)."""

    NO_OWN_GROUP = "no_own_group"
    NOT_SUBSCRIBED = "not_subscribed"
    GATE_CLOSED = "gate_closed"
    NOT_SUCCESS = "not_success"
    NOT_DRAWN = "not_drawn"
    NOT_CANDIDATE = "not_candidate"
    UNBALANCED = "unbalanced"
    OTHER_SOURCE = "other_source"
    COMPAT_BELOW_FLOOR = "compat_below_floor"
    KL_FILTERED = "kl_filtered"

    def __str__(self) -> str:
        return self.value


#: what each drop reason means, and which regimes give it
DROP_REASONS: dict[DropReason, str] = {
    DropReason.NO_OWN_GROUP: "the receiver has no group for the response's prompt this step (every regime)",
    DropReason.NOT_SUBSCRIBED: "the receiver's regime takes nothing from peers (NoSharing)",
    DropReason.GATE_CLOSED: "SGT: the receiver's own group on that prompt has a success, or no peer has one",
    DropReason.NOT_SUCCESS: "SGT, GRAFT's successes ablation and SGT rule: a failed peer response (only successes "
                            "are used)",
    DropReason.NOT_DRAWN: "SGT, GRAFT's SGT rule: a peer success on a rescued prompt other than the one drawn",
    DropReason.NOT_CANDIDATE: "GRAFT: the prompt is not a candidate (the receiver's group is not all-fail, or the "
                              "peer's group is not mixed)",
    DropReason.UNBALANCED: "GRAFT: a candidate left out by balancing (at most as many as the reverse direction has)",
    DropReason.OTHER_SOURCE: "GRAFT (N > 2): another peer's group was chosen for that prompt",
    DropReason.COMPAT_BELOW_FLOOR: "GRAFT: the compatibility score s is at or below δ",
    DropReason.KL_FILTERED: "F-TIS: a negative-advantage response whose per-token KL exceeds kl_threshold",
}


@dataclass(frozen=True)
class Family:
    """A family of logged names with a template (module docstring), what it is, who writes it, and when."""

    template: str
    what: str
    producer: str
    when: str


# -------------------------------------------------------------------------------------------------- composers
def policy(name: str, metric: str) -> str:
    """``<policy>/<metric>``."""
    return f"{name}/{metric}"


def flow(source: str, receiver: str) -> str:
    """``<source>-><receiver>``: an exchange flow, a THL direction or an evaluation direction."""
    return f"{source}->{receiver}"


EXCHANGE = "exchange"
EXCHANGE_COUNTS = ("delivered", "consumed")
"""The flow counts every flow has (plus ``dropped/<reason>`` when something was dropped)."""


def exchange(flow_: str, count: str = "") -> str:
    """``exchange/<flow>/<count>`` (with no count: the flow's prefix, ``exchange/<flow>/``)."""
    return f"{EXCHANGE}/{flow_}/{count}"


def dropped(reason: str) -> str:
    """The count part of a drop reason: ``dropped/<reason>``."""
    return f"dropped/{reason}"


def published(source: str) -> str:
    """``exchange/<source>/published``."""
    return f"{EXCHANGE}/{source}/published"


THL_STATS = ("residual_mean", "residual_p90", "residual_max", "group_count_mismatch")


def thl(source: str, receiver: str, stat: str) -> str:
    """``thl/<source>-><receiver>/<stat>``."""
    return f"thl/{flow(source, receiver)}/{stat}"


COMPLEMENTARITY = "complementarity"
COMPLEMENTARITY_PARTS = ("all_fail", "solved", "mixed_frac", "all_pass_frac")


def complementarity(direction: str, part: str = "") -> str:
    """``complementarity/<A>-><B>`` (the share) or ``complementarity/<A>-><B>/<part>``."""
    return f"{COMPLEMENTARITY}/{direction}" + (f"/{part}" if part else "")


VAL = "val"
PASS1 = "pass@1"


def val_metrics(k: int, greedy: bool) -> tuple[str, ...]:
    """The held-out metrics of one policy: ``pass@1``, ``pass@<k>``, ``maj@<k>``, ``boxed_rate``, ``greedy`` (with
    a greedy sample) and ``num_problems``."""
    return (PASS1, f"pass@{k}", f"maj@{k}", "boxed_rate", *(("greedy",) if greedy else ()), "num_problems")


def val_metric(metric: str, skill: str | None = None) -> str:
    """``<metric>`` or, for one skill, ``<metric>/<skill>``."""
    return metric + ("" if skill is None else f"/{skill}")


def val(metric: str, skill: str | None = None) -> str:
    """The part after ``<policy>/``: ``val/<metric>`` or, for one skill, ``val/<metric>/<skill>``."""
    return f"{VAL}/{val_metric(metric, skill)}"


ALLOC = "alloc"
ALLOC_PLAN = ("n", "update")
ALLOC_TOTALS = ("generated_tokens", "trained_tokens", "wall_s", "device_s", "steps", "updates")
""":class:`mutual_rl.allocation.accounting.PolicyUsage`'s fields, logged as ``alloc/<policy>/<field>_total``."""


def alloc(name: str, part: str) -> str:
    """``alloc/<policy>/<part>``."""
    return f"{ALLOC}/{name}/{part}"


def alloc_total(name: str, usage_field: str) -> str:
    """``alloc/<policy>/<field>_total``."""
    return alloc(name, f"{usage_field}_total")


# --------------------------------------------------------------------------------------------------- families
_STEP, _EVAL, _MWRA = "every step", "every evaluation", "every step, with ResourceAllocation (MWRA)"
FAMILIES: tuple[Family, ...] = (
    Family(RUN_REWARD, "mean reward over the policies (the progress bar's)", "mutual_rl.module", _STEP),
    Family(published("<source>"), "responses the policy published to the exchange this step",
           "mutual_rl.exchange.bus", _STEP + ", with a peer"),
    *(Family(exchange(flow("<source>", "<receiver>"), c), w, "mutual_rl.exchange.bus", _STEP + ", with a peer")
      for c, w in (("delivered", "peer responses delivered to the receiver this step"),
                   ("consumed", "of those, the ones the receiver trained on"))),
    *(Family(exchange(flow("<source>", "<receiver>"), dropped(r.value)), "of those, the ones dropped: " + w,
             "mutual_rl.exchange.bus", _STEP + ", with a peer") for r, w in DROP_REASONS.items()),
    *(Family(thl("<source>", "<receiver>", s), w, "mutual_rl.regimes.crossing", "every thl_residual_every_n_steps "
             "steps, for the responses that crossed tokenizers")
      for s, w in (("residual_mean", "mean |aligned peer trace - receiver log-prob| per token (nats)"),
                   ("residual_p90", "90th percentile of that residual (nats)"),
                   ("residual_max", "its largest value (nats)"),
                   ("group_count_mismatch", "share of alignment groups whose token counts differ"))),
    *(Family(policy("<policy>", val(m) + suffix), w + tail, "mutual_rl.evaluation.validation", _EVAL)
      for suffix, tail in (("", ""), ("/<skill>", ", on the prompts of one skill"))
      for m, w in (("pass@1", "held-out pass@1 (mean over prompts of the share of k samples correct)"),
                   ("pass@<k>", "held-out pass@k (unbiased estimator)"),
                   ("maj@<k>", "majority vote over the k samples is correct"),
                   ("boxed_rate", "share of samples with a \\boxed{} answer"),
                   ("greedy", "greedy sample correct (evaluation.greedy: true)"),
                   ("num_problems", "held-out prompts evaluated"))),
    Family(VAL_MEAN, "mean held-out pass@1 over the policies (the progress bar's)", "mutual_rl.evaluation.validation",
           _EVAL),
    Family(complementarity(flow("<A>", "<B>")), "share of A's all-fail held-out prompts that B solves at least once",
           "mutual_rl.evaluation.complementarity", _EVAL + ", with a peer"),
    *(Family(complementarity(flow("<A>", "<B>"), p), w, "mutual_rl.evaluation.complementarity", _EVAL + ", with a peer")
      for p, w in (("all_fail", "A's all-fail held-out prompts (the denominator)"),
                   ("solved", "of those, the ones B solves at least once"),
                   ("mixed_frac", "share of them where B's group is mixed"),
                   ("all_pass_frac", "share of them where every one of B's samples is correct"))),
    Family(alloc("<policy>", "n"), "rollouts per prompt MWRA gave the policy this step",
           "mutual_rl.callbacks.allocation", _MWRA),
    Family(alloc("<policy>", "update"), "1 if MWRA let the policy update this step, else 0",
           "mutual_rl.callbacks.allocation", _MWRA),
    *(Family(alloc_total("<policy>", f), f"the policy's {f.replace('_', ' ')} so far",
             "mutual_rl.allocation.accounting", _MWRA) for f in ALLOC_TOTALS),
)
