"""What is logged comes from one place (mutual_rl.catalogue): every name a run logs is listed, each entry is
documented, docs/metrics.md is the generated page, and each family of mutual_rl.names is produced by some run."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning.pytorch as pl
import pytest
from lightning.pytorch.loggers import CSVLogger

from mutual_rl import catalogue, names
from mutual_rl.callbacks.allocation import ResourceAllocation
from mutual_rl.exchange import ExperienceExchange
from mutual_rl.module import MutualRLModule
from mutual_rl.regimes import get_regime
from mutual_rl.rewards import register_reward
from mutual_rl.rewards.base import available_rewards
from mutual_rl.update.config import GRPOConfig
from tests.module.helpers import datamodule, pair, spec, trainer

DOCS = Path(__file__).parents[1] / "docs" / "metrics.md"

if "test_len_mod3" not in available_rewards():

    @register_reward("test_len_mod3")
    def _len_mod3(completion: str, answer: str) -> float:
        """1 iff the response length is a multiple of 3: all-fail and mixed groups of 4 are both common, so the
        sharing regimes' gates open within a few steps."""
        return float(len(completion) % 3 == 0)


def test_docs_page_is_the_generated_one():
    assert DOCS.read_text() == catalogue.markdown(), "regenerate: python -m mutual_rl.catalogue > docs/metrics.md"


def test_every_entry_is_documented_and_listed_once():
    entries = catalogue.entries()
    assert len({(e.section, e.name) for e in entries}) == len(entries)
    # a name in two sections: written by two producers (the same quantity), or by two regimes
    twice = {e.name for e in entries if sum(f.name == e.name for f in entries) > 1}
    assert twice == {"<policy>/all_fail_frac", "<policy>/rescued/<source>"}
    assert [e.name for e in entries if not e.what] == []
    # the regimes' records are in the list, each under its regime
    assert {"sgt", "graft", "hacpo", "prp", "xgrpo", "ftis"} <= set(catalogue.regime_stats())


@pytest.mark.parametrize("name,producer", [
    ("gpt2/self/approx_kl", "mutual_rl.stats.TokenStats.approx_kl"),
    ("gpt2/peer/is_weight_mean", "mutual_rl.stats.TokenStats.is_weight_mean"),
    ("gpt2/entropy", "mutual_rl.stats.TokenStats.entropy"),
    ("llama/gen_tokens_per_s", "mutual_rl.stats.RolloutStats.gen_tokens_per_s"),
    ("llama/rollout/kl_engine_trainer", "mutual_rl.algorithms.rollout_correction.RolloutMismatch.kl_engine_trainer"),
    ("llama/reward/format", "mutual_rl.stats.ScoringStats.reward_terms"),
    ("exchange/gpt2->llama/dropped/gate_closed", "mutual_rl.exchange.bus"),
    ("exchange/gpt2/published", "mutual_rl.exchange.bus"),
    ("gpt2/val/pass@1/add", "mutual_rl.evaluation.validation"),
    ("gpt2/val/maj@8", "mutual_rl.evaluation.validation"),
    ("complementarity/gpt2->llama/mixed_frac", "mutual_rl.evaluation.complementarity"),
    ("thl/gpt2->llama/residual_p90", "mutual_rl.regimes.crossing"),
    ("alloc/gpt2/wall_s_total", "mutual_rl.allocation.accounting"),
    ("reward", "mutual_rl.module"),
])
def test_find_names_the_producer(name, producer):
    assert catalogue.find(name).producer == producer


@pytest.mark.parametrize("name", ["exchange/gpt2->llama/dropped/no_such_reason", "gpt2/self/no_such_metric",
                                  "gpt2/val", "exchange/gpt2->llama", "thl/gpt2/residual_mean"])
def test_find_refuses_what_nothing_logs(name):
    assert catalogue.find(name) is None


def test_template_patterns():
    e = catalogue.Entry("<policy>/[self/|peer/]ratio_mean", "x", "p", "w", "s")
    assert [bool(e.pattern.match(n)) for n in ("a/ratio_mean", "a/self/ratio_mean", "a/peer/ratio_mean",
                                               "a/own/ratio_mean", "a/b/self/ratio_mean", "a/ratio_mean_x")] \
        == [True, True, True, False, False, False]
    flow = catalogue.Entry(names.exchange(names.flow("<source>", "<receiver>"), "delivered"), "x", "p", "w", "s")
    assert flow.pattern.match("exchange/a->b/delivered") and not flow.pattern.match("exchange/a/delivered")


# ------------------------------------------------------------------------------ what runs log, against the list
#: label -> (regime, its arguments, algorithm arguments, more): every built-in regime and cross rule, DAPO dynamic
#: sampling, MWRA and the evaluation; three policies for GRAFT's source choice
CONFIGS = {
    "none_mwra": ("none", {}, {}, {"alloc": True}),
    "sgt": ("sgt", {"coef": 0.1}, {}, {"trio": True}),
    "graft": ("graft", {"delta": 0.0}, {}, {}),
    "graft_trio": ("graft", {"delta": 0.0}, {}, {"trio": True}),
    "graft_sgt": ("graft", {"delta": 0.0, "update_rule": "sgt", "rule_args": {"coef": 0.1}}, {}, {}),
    "graft_hacpo": ("graft", {"delta": 0.0, "update_rule": "hacpo"}, {"kl_coef": 1e-3, "kl_kind": "k3"}, {}),
    "graft_successes": ("graft", {"delta": 0.9, "transfer": "successes"}, {}, {}),
    "hacpo": ("hacpo", {}, {"kl_coef": 1e-3, "kl_kind": "k3"}, {}),
    "prp": ("prp", {}, {}, {}),
    "prp_aligned": ("prp", {"denominator": "peer_aligned", "objective": "clip"}, {}, {}),
    "xgrpo": ("xgrpo", {}, {}, {}),
    "ftis": ("ftis", {"is_cap": 2.0, "kl_threshold": 0.0}, {}, {}),
    "dapo_ds": ("none", {}, {"dynamic_sampling": True}, {}),
}


def logged_names(label: str, tmp_path) -> set[str]:
    """Every name the CSV logger wrote a value for in a 3-step run with an evaluation at the end."""
    regime, rargs, algo, more = CONFIGS[label]
    pl.seed_everything(0)
    specs = pair() + ([spec("llama_bpe", "tiny:llama-bpe")] if more.get("trio") else [])
    m = MutualRLModule(specs, algorithm=GRPOConfig(num_mini_batches=2, **algo), regime=get_regime(regime, **rargs),
                       reward="test_len_mod3", log_samples_every_n_steps=0, thl_residual_every_n_steps=1)
    callbacks = [ExperienceExchange()] + ([ResourceAllocation()] if more.get("alloc") else [])
    logger = CSVLogger(str(tmp_path), name="rows", version=0)
    trainer(tmp_path, max_steps=3, logger=logger, log_every_n_steps=1, callbacks=callbacks, limit_val_batches=1,
            val_check_interval=3).fit(m, datamodule=datamodule())
    rows = list(csv.DictReader(open(tmp_path / "rows" / "version_0" / "metrics.csv")))
    return {k for r in rows for k, v in r.items() if v not in ("", None)} - {"step", "epoch"}


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> dict[str, set[str]]:
    return {label: logged_names(label, tmp_path_factory.mktemp(label)) for label in CONFIGS}


#: families no run above produces, and why
NOT_PRODUCED_HERE = {
    names.exchange(names.flow("<source>", "<receiver>"), names.dropped(names.DropReason.NOT_SUBSCRIBED)):
        "NoSharing subscribes to nothing, so nothing is delivered to it in a co-trained run",
    names.exchange(names.flow("<source>", "<receiver>"), names.dropped(names.DropReason.NO_OWN_GROUP)):
        "co-trained policies answer the same prompts; a replayed peer's recorded prompts can differ "
        "(tests/regimes: test_sgt, test_graft, test_hacpo, test_prp, test_xgrpo, test_ftis)",
}


@pytest.mark.slow
def test_every_logged_name_is_listed(logged):
    unlisted = {label: sorted(n for n in ns if catalogue.find(n) is None) for label, ns in logged.items()}
    assert {k: v for k, v in unlisted.items() if v} == {}


@pytest.mark.slow
def test_every_family_and_regime_record_is_logged_by_some_run(logged):
    seen = {catalogue.find(n).name for ns in logged.values() for n in ns if catalogue.find(n)}
    families = {f.template for f in names.FAMILIES}
    regime_entries = {e.name for e in catalogue.entries() if e.when.startswith("every step, regime")}
    missing = sorted((families | regime_entries) - seen - set(NOT_PRODUCED_HERE))
    assert missing == []
