"""Every tag the comparison reads is a name the trainer logs: each is an instance of an entry of mutual_rl.catalogue
(so a renamed metric fails here, not as an empty column in a report)."""

from __future__ import annotations

import pytest

from mutual_rl import catalogue
from mutual_rl.compare import tags
from mutual_rl.compare.tags import Complementarity, PolicyTag


def _policy_metrics() -> list[str]:
    own = [v for k, v in vars(PolicyTag).items() if k.isupper()]
    diag = [m for ms in tags.DIAG_GROUPS.values() for m in ms]
    return sorted(set(own + diag + list(tags.CURVE_TAGS)))


@pytest.mark.parametrize("metric", _policy_metrics())
def test_per_policy_tag_is_logged(metric):
    # a metric the diagnostics sum over sources (``rescued``: SGT's total, GRAFT's per source) may be either form
    hit = catalogue.find(tags.policy("gpt2", metric)) or catalogue.find(tags.policy("gpt2", f"{metric}/llama"))
    assert hit is not None, f"{metric}: no producer logs <policy>/{metric}"


def test_run_level_flow_and_direction_tags_are_logged():
    found = {
        tags.REWARD: catalogue.find(tags.REWARD),
        "exchange consumed": catalogue.find(tags.exchange("gpt2->llama", tags.CONSUMED)),
        "rescued": catalogue.find(tags.rescued("gpt2", "llama")),
        **{f"complementarity/{p or 'share'}": catalogue.find(tags.complementarity("gpt2->llama", p))
           for _, p in tags.STEP0_PARTS},
        "pass@1 per skill": catalogue.find(tags.policy("gpt2", f"{PolicyTag.VAL_PASS1}/add")),
    }
    assert [k for k, v in found.items() if v is None] == []
    assert {Complementarity.ALL_FAIL, Complementarity.SOLVED, Complementarity.MIXED_FRAC,
            Complementarity.ALL_PASS_FRAC} == {p for _, p in tags.STEP0_PARTS if p}


def test_tag_helpers_read_what_the_producers_write():
    assert tags.is_pass1("gpt2/val/pass@1") and not tags.is_pass1("gpt2/val/pass@1/add")
    assert tags.skill_of("gpt2/val/pass@1/add") == "add"
    assert tags.direction_of("complementarity/gpt2->llama") == "gpt2->llama"
    assert tags.consumed_flow("exchange/gpt2->llama/consumed") == "gpt2->llama"
    assert tags.flow_of("exchange/gpt2/published") is None
