"""GRAFT §6.3's cross rules: the prompts GRAFT selects (candidates, balancing, source choice) trained with HACPO's
update rule (``update_rule: hacpo``) or SGT's (``update_rule: sgt``); hand-derived rows, advantages, NLL term, flows
and metrics, argument errors, state."""

from __future__ import annotations

import math

import pytest
import torch

from mutual_rl.regimes import get_regime
from mutual_rl.regimes.graft import GRAFT
from mutual_rl.regimes.hacpo import HACPO
from mutual_rl.stats import flatten
from mutual_rl.step.scoring import plan_regime
from tests.regimes.scenario import FakeReceiver, make_group


def scenario():
    """R: q0 all-fail, q1 mixed, q2 all-fail. S: q0 mixed (C_{S→R} = {q0}), q1 all-fail (C_{R→S} = {q1}: m = 1),
    q2 all-pass (not a candidate)."""
    recv = FakeReceiver("r")
    own = [make_group("r", 0, [0, 0]), make_group("r", 1, [1, 0]), make_group("r", 2, [0, 0])]
    peers = {"s": [make_group("s", 0, [1, 0, 0], kind="bpe", texts=["46", "47", "48"]),
                   make_group("s", 1, [0, 0], kind="bpe"), make_group("s", 2, [1, 1], kind="bpe")]}
    return recv, own, peers


def test_hacpo_rule_pools_only_the_selected_prompt():
    recv, own, peers = scenario()
    plan = plan_regime(get_regime("graft", update_rule="hacpo"), recv, own, peers, 2)
    assert plan.objective == HACPO().objective  # HACPO's, with its defaults
    b = plan.batch
    # HACPO's order: R's own rows (6) in 2 mini-batches of 3, then the 3 rows of S's q0 group in one more
    assert b.prompt_ids == [0, 0, 1, 1, 2, 2, 0, 0, 0]
    assert b.is_peer.tolist() == [False] * 6 + [True] * 3
    assert plan.mini_batches == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    # capability over every delivered group: P_R = 1/6, P_S = (1 + 0 + 2)/7 = 3/7 -> ratio 7/18.
    # q0 pooled [0, 0 | 1, 0, 0]: b = (7/18)/5, std = sqrt(0.2); q1 own alone [1, 0]: GRPO's ±0.5/std(0.7071);
    # q2 own alone, identical rewards: 0
    metrics = flatten(plan.metrics)
    assert metrics["capability/s"] == pytest.approx(3 / 7) and metrics["cap_ratio/s"] == pytest.approx(7 / 18)
    base, sd = (7 / 18) / 5, math.sqrt(0.2) + 1e-6
    a1 = 0.5 / (math.sqrt(0.5) + 1e-6)
    expected = [-base / sd, -base / sd, a1, -a1, 0.0, 0.0, (1 - base) / sd, -base / sd, -base / sd]
    torch.testing.assert_close(b.advantages, torch.tensor(expected), rtol=0, atol=1e-6)
    assert torch.allclose(b.cap_ratio, torch.tensor([1.0] * 6 + [7 / 18] * 3))
    assert plan.flows == {"s": {"consumed": 3, "not_candidate": 4}}
    m = flatten(plan.metrics)
    assert (m["candidates/s"], m["candidates_reverse/s"], m["selected/s"]) == (1.0, 1.0, 1.0)
    assert m["rescued/s"] == 1.0 and m["transferred_groups"] == 1.0
    assert m["transferred_responses"] == m["transferred_responses/s"] == m["peer_responses"] == 3.0
    assert "compat_s_mean" not in m
    # HACPO's state (capability windows, steps planned) is the regime's
    state = get_regime("graft", update_rule="hacpo")
    plan_regime(state, recv, own, peers, 2)
    saved = state.state_dict()
    assert saved["rule"]["updates"] == {"r": 1} and set(saved["rule"]["windows"]) == {"r", "s"}
    other = GRAFT(update_rule="hacpo")
    other.load_state_dict(saved)
    assert other.state_dict() == saved


def test_sgt_rule_adds_one_drawn_success_of_the_selected_prompt():
    recv, own, peers = scenario()
    plan = plan_regime(get_regime("graft", update_rule="sgt", rule_args={"coef": 0.25}), recv, own, peers, 2)
    base = plan_regime(get_regime("none"), recv, own, {}, 2)
    assert plan.objective is None  # DAPO
    assert torch.equal(plan.batch.input_ids, base.batch.input_ids) and plan.mini_batches == base.mini_batches
    assert torch.equal(plan.batch.advantages, base.batch.advantages)  # R's own GRPO batch, unchanged
    nll = plan.nll
    assert nll.coef == 0.25 and nll.batch.prompt_ids == [0] and nll.mini_batches == [[0], []]
    ids = nll.batch.input_ids[0, -nll.batch.response_width:][nll.batch.response_mask[0].bool()].tolist()
    assert recv.tokenizer.decode(ids, skip_special_tokens=True) == "46"  # q0's only success
    # q2: SGT alone would rescue it (S succeeds), GRAFT does not select it (all-pass source group)
    assert plan_regime(get_regime("sgt"), recv, own, peers, 2).nll.batch.prompt_ids == [0, 2]
    assert plan.flows == {"s": {"consumed": 1, "not_success": 2, "not_candidate": 4}}
    m = flatten(plan.metrics)
    assert m["rescued/s"] == m["rescued"] == m["transferred_groups"] == m["transferred_responses"] == 1.0


def test_no_selection_is_plain_rule_without_peers():
    recv, own, _ = scenario()
    peers = {"s": [make_group("s", 0, [1, 0, 0], kind="bpe")]}  # no reverse candidate: m = 0
    plan = plan_regime(get_regime("graft", update_rule="sgt"), recv, own, peers, 2)
    assert plan.nll is None and plan.flows == {"s": {"unbalanced": 3}}
    assert flatten(plan.metrics)["transferred_groups"] == 0.0
    plan = plan_regime(get_regime("graft", update_rule="hacpo"), recv, own, peers, 2)
    assert not plan.batch.is_peer.any() and plan.flows == {"s": {"unbalanced": 3}}


@pytest.mark.parametrize("kw, match", [
    ({"update_rule": "ppo"}, r"update_rule='ppo' is not one of: graft, hacpo, sgt"),
    ({"rule_args": {"coef": 0.1}}, r"rule_args=\{'coef': 0.1\} applies to update_rule hacpo or sgt only"),
    ({"update_rule": "sgt", "compatibility": "off"}, r"compatibility='off' belongs to GRAFT's own update rule"),
    ({"update_rule": "sgt", "rule_args": {"window": 3}}, r"rule_args=\{'window': 3\} are not arguments of the sgt"),
    ({"update_rule": "hacpo", "rule_args": {"row_order": "x"}}, r"row_order='x' is not one of"),
])
def test_bad_arguments_name_the_argument(kw, match):
    with pytest.raises(ValueError, match=match):
        get_regime("graft", **kw)
