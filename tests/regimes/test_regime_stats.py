"""Each regime's statistics are a typed record (its class's ``stats_type``) whose logged names are the ones
the regimes have always logged: hand-listed here from the regimes' code, with hand-derived values on small
inputs; and every field of every record has a docstring (the reference documentation is made from them)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

import pytest
import torch

from mutual_rl.regimes import FTIS, GRAFT, HACPO, PRP, SGT, XGRPO, NoSharing, get_regime
from mutual_rl.regimes.ftis import FTISStats
from mutual_rl.regimes.graft import GraftStats
from mutual_rl.regimes.hacpo import HACPOStats
from mutual_rl.regimes.prp import PRPStats
from mutual_rl.regimes.sgt import SGTStats
from mutual_rl.regimes.xgrpo import XGRPOStats
from mutual_rl.stats import RolloutStats, ScoringStats, count_names, flatten, merge
from mutual_rl.step.report import PolicyStepReport
from mutual_rl.step.scoring import plan_regime
from tests.regimes.scenario import FakeReceiver, make_group

RECORDS = (SGTStats, GraftStats, HACPOStats, PRPStats, XGRPOStats, FTISStats)

#: GRAFT's gate grid (regimes/graft_gate.py): each δ of GATE_DELTAS, each percentile of QUANTILES, per outcome
GATE_SUCCESS = {"gate/admit_success@0.3", "gate/admit_success@0.5", "gate/admit_success@0.7",
                "gate/admit_success@0.8", "gate/admit_success@0.9", "gate/s_p10_success",
                "gate/s_p25_success", "gate/s_p50_success", "gate/s_p75_success", "gate/s_p90_success"}
GATE_FAILURE = {"gate/admit_failure@0.3", "gate/admit_failure@0.5", "gate/admit_failure@0.7",
                "gate/admit_failure@0.8", "gate/admit_failure@0.9", "gate/s_p10_failure",
                "gate/s_p25_failure", "gate/s_p50_failure", "gate/s_p75_failure", "gate/s_p90_failure"}
SELECTION = {"candidates/llama", "candidates_reverse/llama", "selected/llama", "rescued/llama",
             "transferred_responses/llama", "transferred_groups", "transferred_responses"}


def receiver() -> FakeReceiver:
    """The receiver ``r``: -0.5 per token, as the peers' default traces (GRAFT's ``s`` is 1, F-TIS's KL 0)."""
    return FakeReceiver("r", logp_fn=lambda ids, w: torch.full((ids.shape[0], w), -0.5))


def scenario(kind: str = "bpe"):
    """``r`` fails prompt 0 and half-solves prompt 1; its one peer ``llama`` half-solves 0 and fails 1. GRAFT:
    ``C_{S→R} = {0}``, ``C_{R→S} = {1}``, so prompt 0 is selected (balanced, m = 1)."""
    own = [make_group("r", 0, [0, 0]), make_group("r", 1, [1, 0])]
    peers = {"llama": [make_group("llama", 0, [1, 0], kind=kind), make_group("llama", 1, [0, 0], kind=kind)]}
    return receiver(), own, peers


def plan_of(name: str, kind: str = "bpe", **args):
    recv, own, peers = scenario(kind)
    regime = get_regime(name, **args)
    plan = plan_regime(regime, recv, own, peers, 2)
    assert isinstance(plan.metrics, type(regime).stats_type)
    return plan


def test_sgt_names_and_values():
    m = flatten(plan_of("sgt").metrics)
    assert set(m) == {"rescued", "gate_rate", "all_fail_frac", "rescued/llama"}
    assert m == {"rescued/llama": 1.0, "rescued": 1.0, "gate_rate": 0.5, "all_fail_frac": 0.5}
    recv, own, _ = scenario()
    alone = plan_regime(get_regime("sgt"), recv, own, {}, 2)  # no source: no per-source name
    assert set(flatten(alone.metrics)) == {"rescued", "gate_rate", "all_fail_frac"}


def test_graft_names_and_values():
    m = flatten(plan_of("graft").metrics)
    assert set(m) == SELECTION | GATE_SUCCESS | GATE_FAILURE | {
        "admitted_frac", "evaluated_success", "evaluated_failure", "admitted_success", "admitted_failure",
        "admitted_frac_success", "admitted_frac_failure", "compat_s_mean", "compat_s_min", "compat_s_max"}
    # prompt 0's group [1, 0] grafted whole, s = exp(-0.5 + 0.5) = 1 for both: admitted at every δ < 1
    assert m["candidates/llama"] == m["candidates_reverse/llama"] == m["selected/llama"] == 1.0
    assert m["rescued/llama"] == m["transferred_groups"] == 1.0
    assert m["transferred_responses/llama"] == m["transferred_responses"] == 2.0
    assert (m["evaluated_success"], m["evaluated_failure"], m["admitted_success"], m["admitted_failure"]) == \
        (1.0, 1.0, 1.0, 1.0)
    assert m["admitted_frac"] == m["admitted_frac_success"] == m["admitted_frac_failure"] == 1.0
    assert m["compat_s_mean"] == m["compat_s_min"] == m["compat_s_max"] == 1.0
    assert m["gate/admit_success@0.9"] == m["gate/admit_failure@0.3"] == m["gate/s_p50_failure"] == 1.0


def test_graft_names_of_a_kind_never_evaluated_are_absent():
    # transfer="successes": only the success is crossed and scored: the failure-side shares are absent (not 0)
    m = flatten(plan_of("graft", transfer="successes").metrics)
    assert set(m) == SELECTION | GATE_SUCCESS | {
        "admitted_frac", "evaluated_success", "evaluated_failure", "admitted_success", "admitted_failure",
        "admitted_frac_success", "compat_s_mean", "compat_s_min", "compat_s_max"}
    assert m["evaluated_failure"] == m["admitted_failure"] == 0.0 and m["transferred_responses"] == 1.0
    # nothing selected (one source group, no reverse candidate): nothing scored, no s statistics at all
    recv, own, _ = scenario()
    plan = plan_regime(get_regime("graft"), recv, own, {"llama": [make_group("llama", 0, [1, 0], kind="bpe")]}, 2)
    m = flatten(plan.metrics)
    assert set(m) == SELECTION | {"admitted_frac", "evaluated_success", "evaluated_failure",
                                  "admitted_success", "admitted_failure"}
    assert m["admitted_frac"] == 0.0 and m["selected/llama"] == 0.0 and m["candidates/llama"] == 1.0


def test_graft_sgt_rule_names_and_values():
    plan = plan_of("graft", update_rule="sgt")
    m = flatten(plan.metrics)
    assert set(m) == SELECTION | {"rescued", "gate_rate", "all_fail_frac"}
    assert m["rescued/llama"] == m["rescued"] == m["transferred_groups"] == 1.0
    assert m["transferred_responses/llama"] == m["transferred_responses"] == 1.0  # one drawn success
    assert m["gate_rate"] == m["all_fail_frac"] == 0.5
    # rescued/<source> is GRAFT's name: the nested SGT record leaves its own per-source counts out
    assert isinstance(plan.metrics.rule, SGTStats) and plan.metrics.rule.rescued_by == {}
    assert plan.metrics.rescued_by == {"llama": 1} and plan.metrics.admitted_frac is None


def test_graft_hacpo_rule_names_and_values():
    plan = plan_of("graft", update_rule="hacpo")
    m = flatten(plan.metrics)
    assert set(m) == SELECTION | {"capability/r", "capability/llama", "cap_ratio/llama", "L_m_first", "m",
                                  "peer_responses"}
    # P_R = 1/4 (r's 4 responses), P_S = 1/4 (every delivered group observed): ratio 1; q0's group pooled
    assert m["capability/r"] == m["capability/llama"] == 0.25 and m["cap_ratio/llama"] == 1.0
    assert m["L_m_first"] == 0.8 and m["m"] == 0.0
    assert m["peer_responses"] == m["transferred_responses/llama"] == m["transferred_responses"] == 2.0
    assert isinstance(plan.metrics.rule, HACPOStats)


def test_hacpo_names_and_values():
    m = flatten(plan_of("hacpo").metrics)
    assert set(m) == {"capability/r", "capability/llama", "cap_ratio/llama", "L_m_first", "m",
                      "peer_responses"}
    assert m == {"capability/r": 0.25, "capability/llama": 0.25, "cap_ratio/llama": 1.0, "L_m_first": 0.8,
                 "m": 0.0, "peer_responses": 4.0}


@pytest.mark.parametrize("denominator", ["learner_snapshot", "peer_aligned"])
def test_prp_names_and_values(denominator):
    m = flatten(plan_of("prp", denominator=denominator).metrics)
    assert set(m) == {"prp/peer_rows", "prp/peer_frac", "prp/pool_size", "prp/peer_adv_mean"}
    # pools [0, 0 | 1, 0] and [1, 0 | 0, 0] (one std): peer advantages (0.75, -0.25, -0.25, -0.25) / std,
    # mean 0
    assert m["prp/peer_rows"] == 4.0 and m["prp/peer_frac"] == 0.5 and m["prp/pool_size"] == 4.0
    assert m["prp/peer_adv_mean"] == pytest.approx(0.0, abs=1e-6)


def test_xgrpo_names_and_values():
    m = flatten(plan_of("xgrpo").metrics)
    assert set(m) == {"xgrpo/pooled_frac", "xgrpo/pool_size", "xgrpo/adv_abs_diff", "xgrpo/signal_frac"}
    assert m["xgrpo/pooled_frac"] == 1.0 and m["xgrpo/pool_size"] == 4.0 and m["xgrpo/signal_frac"] == 1.0
    assert m["xgrpo/adv_abs_diff"] > 0  # r's prompt-0 rows: GRPO 0, pooled -0.25 / std


def test_ftis_names_and_values():
    m = flatten(plan_of("ftis", kind="char").metrics)  # shared vocabulary: the generator's trace, the peer's
    assert set(m) == {"ftis/peer_rows", "ftis/peer_frac", "ftis/pool_size", "ftis/filtered",
                      "ftis/filtered_frac", "ftis/neg_frac", "ftis/peer_adv_mean", "ftis/peer_kl_mean",
                      "ftis/peer_kl_max"}
    # KL = mean(-0.5 - (-0.5)) = 0: nothing filtered; peer advantages (+, -, -, -) as PRP's
    assert (m["ftis/peer_rows"], m["ftis/peer_frac"], m["ftis/pool_size"]) == (4.0, 0.5, 4.0)
    assert m["ftis/filtered"] == m["ftis/filtered_frac"] == 0.0 and m["ftis/neg_frac"] == 0.75
    assert m["ftis/peer_kl_mean"] == m["ftis/peer_kl_max"] == 0.0
    recv, own, _ = scenario()
    alone = flatten(plan_regime(get_regime("ftis"), recv, own, {}, 2).metrics)  # nothing paired: no KL names
    assert set(alone) == {"ftis/peer_rows", "ftis/peer_frac", "ftis/pool_size", "ftis/filtered",
                          "ftis/filtered_frac", "ftis/neg_frac", "ftis/peer_adv_mean"}
    assert alone["ftis/pool_size"] == 2.0 and alone["ftis/peer_rows"] == 0.0


def test_no_sharing_reports_nothing():
    recv, own, peers = scenario()
    assert plan_regime(get_regime("none"), recv, own, peers, 2).metrics is None


def test_stats_types():
    assert {cls: cls.stats_type for cls in (NoSharing, SGT, GRAFT, HACPO, PRP, XGRPO, FTIS)} == {
        NoSharing: None, SGT: SGTStats, GRAFT: GraftStats, HACPO: HACPOStats, PRP: PRPStats,
        XGRPO: XGRPOStats, FTIS: FTISStats}
    for record in RECORDS:
        assert dataclasses.is_dataclass(record) and record.__dataclass_params__.frozen


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_every_field_has_a_docstring(record):
    """A string literal right after each field (the attribute docstrings the reference docs read)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(record))).body[0].body
    documented = {}
    for node, after in zip(body, body[1:] + [None]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            is_doc = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
            documented[node.target.id] = after.value.value if is_doc else None
    assert set(documented) == {f.name for f in dataclasses.fields(record)}
    missing = [name for name, doc in documented.items() if not isinstance(doc, str) or not doc.strip()]
    assert not missing, f"{record.__name__}: fields without a docstring: {missing}"


def _report(regime_stats) -> PolicyStepReport:
    rollout = RolloutStats(generated_tokens=8.0, gen_s=2.0, response_length=4.0, eos_frac=1.0)
    scoring = ScoringStats(reward=0.25, pass_rate=0.25, all_fail_frac=0.5, all_pass_frac=0.0, mixed_frac=0.5)
    return PolicyStepReport("r", rollout, scoring, regime=regime_stats)


def test_step_report_logs_merges_and_counts_a_record_or_none():
    base = flatten(_report(None), "r/")
    assert "r/reward" in base and not any(k.endswith(("rescued", "gate_rate")) for k in base)
    a, b = plan_of("graft", update_rule="sgt").metrics, plan_of("graft", update_rule="hacpo").metrics
    assert flatten(_report(a), "r/") == {**base, **{f"r/{k}": v for k, v in flatten(a).items()}}
    assert count_names(_report(a), "r/") == count_names(_report(None), "r/")  # no regime statistic is a count
    hacpo = plan_of("hacpo").metrics
    other = dataclasses.replace(hacpo, capability={"r": 0.75}, peer_responses=2)
    two = merge([_report(hacpo), _report(other)])
    assert two.regime.capability == {"r": 0.5, "llama": 0.25} and two.regime.peer_responses == 3.0  # means
    assert flatten(merge([_report(b), _report(b)]).regime) == flatten(b)
