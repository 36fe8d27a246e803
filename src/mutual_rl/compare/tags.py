"""The TensorBoard tags the comparison reads.

The trainer writes them (the module's step metrics, the regimes, the exchange, the evaluation); the names that are
not record fields are composed by :mod:`mutual_rl.names`, and this module takes them from there. Every tag spelled
here is one that :mod:`mutual_rl.catalogue` lists (tests/compare/test_tags_logged.py checks each against it). Three
families:

* per policy: ``<policy>/<metric>`` (:class:`PolicyTag` names the metrics; a regime's per-source metrics are
  ``<policy>/<metric>/<source>``, e.g. ``gpt2/rescued/llama``);
* per evaluation direction ``A->B`` (A's all-fail held-out prompts, B's groups on them):
  ``complementarity/A->B`` and ``complementarity/A->B/<part>`` (:class:`Complementarity`);
* per exchange flow ``S->R``: ``exchange/S->R/<count>`` (delivered, consumed, dropped/<reason>, ...).
"""

from __future__ import annotations

from typing import Final

from mutual_rl import names


class PolicyTag:
    """Per-policy metric names (the part after ``<policy>/``)."""

    VAL_PASS1: Final = names.val(names.PASS1)  # held-out pass@1 (per skill: val/pass@1/<skill>)
    VAL_BOXED_RATE: Final = names.val("boxed_rate")
    VAL_NUM_PROBLEMS: Final = names.val("num_problems")
    REWARD: Final = "reward"
    GENERATED_TOKENS: Final = "generated_tokens"
    RESPONSE_LENGTH: Final = "response_length"
    TRAINED_TOKENS: Final = "trained_tokens"
    GEN_S: Final = "gen_s"
    TRAIN_S: Final = "train_s"
    EXTRA_ROLLOUTS: Final = "dynamic_sampling/extra_rollouts"
    ENTROPY: Final = "entropy"
    APPROX_KL: Final = "approx_kl"  # every row of the update
    SELF_APPROX_KL: Final = "self/approx_kl"  # the policy's own rows only (comparable across regimes)
    RESCUED: Final = "rescued"  # per source: rescued/<source> (SGT's rescued prompts, GRAFT's grafted groups)


class Complementarity:
    """The parts of ``complementarity/A->B/<part>`` (the share itself has no part)."""

    PREFIX: Final = names.COMPLEMENTARITY
    ALL_FAIL, SOLVED, MIXED_FRAC, ALL_PASS_FRAC = names.COMPLEMENTARITY_PARTS


EXCHANGE: Final = names.EXCHANGE
CONSUMED: Final = "consumed"
REWARD: Final = names.RUN_REWARD
"""the run-level reward (no policy prefix): one per training step, its wall time times the steps"""
policy = names.policy
complementarity = names.complementarity
exchange = names.exchange


def policy_of(tag: str) -> str:
    """The first part of a tag (the policy of a per-policy tag)."""
    return tag.split("/", 1)[0]


def rescued(receiver: str, source: str) -> str:
    return f"{receiver}/{PolicyTag.RESCUED}/{source}"


def is_pass1(tag: str) -> bool:
    """A policy's overall held-out pass@1."""
    return tag.endswith("/" + PolicyTag.VAL_PASS1)


def skill_of(tag: str) -> str | None:
    """The skill of a per-skill pass@1 tag (``<p>/val/pass@1/<skill>``), else None."""
    marker = f"/{PolicyTag.VAL_PASS1}/"
    return tag.rsplit("/", 1)[1] if marker in tag else None


def direction_of(tag: str) -> str | None:
    """``A->B`` of a ``complementarity/A->B`` share tag (no part), else None."""
    parts = tag.split("/")
    return parts[1] if len(parts) == 2 and parts[0] == Complementarity.PREFIX else None


def flow_of(tag: str) -> str | None:
    """``S->R`` of an ``exchange/S->R/...`` or ``complementarity/S->R/...`` tag, else None."""
    parts = tag.split("/")
    if len(parts) >= 2 and parts[0] in (EXCHANGE, Complementarity.PREFIX) and "->" in parts[1]:
        return parts[1]
    return None


def consumed_flow(tag: str) -> str | None:
    """``S->R`` of an ``exchange/S->R/consumed`` tag, else None."""
    flow = flow_of(tag)
    return flow if flow and tag.startswith(EXCHANGE + "/") and tag.endswith("/" + CONSUMED) else None


#: per-policy series the figures read (and ``curves.json`` keeps); KL: own rows when logged
CURVE_TAGS = (PolicyTag.VAL_PASS1, PolicyTag.ENTROPY, PolicyTag.SELF_APPROX_KL, PolicyTag.APPROX_KL)
#: the step-0 table's columns: its key -> the complementarity part ("": the share itself)
STEP0_PARTS = (("complementarity", ""), ("mixed_frac", Complementarity.MIXED_FRAC),
               ("all_pass_frac", Complementarity.ALL_PASS_FRAC), ("all_fail", Complementarity.ALL_FAIL),
               ("solved", Complementarity.SOLVED))

#: diagnostics.md: topic -> per-policy metrics (mean per training step; ``*_min`` / ``*_max``: min / max over
#: steps); a metric a run lacks whose per-source parts ``<metric>/<source>`` it logs is their sum
DIAG_GROUPS = {
    "Outcomes and updates": ("all_fail_frac", "mixed_frac", "all_pass_frac", "skipped_frac", "nll", "entropy",
                             "approx_kl", "self/approx_kl", "self/clip_frac_low", "self/clip_frac_high",
                             "peer/clip_frac_low", "peer/clip_frac_high"),
    "Peer rows and HACPO's ratios": ("peer/approx_kl", "peer/ratio_mean", "L_m", "peer/seq_ratio_mean",
                                     "self/seq_ratio_mean", "self/clip_frac"),
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
