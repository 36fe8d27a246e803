"""XGRPO: own rollouts, advantages from rewards pooled over all policies (hand-derived values)."""

from __future__ import annotations

import math

import pytest
import torch

from mutual_rl.algorithms import grpo_advantages
from mutual_rl.regimes import get_regime
from mutual_rl.regimes.base import own_batch, split_rows
from mutual_rl.stats import flatten
from mutual_rl.step.scoring import plan_regime
from tests.regimes.helpers_xsp import assert_flows, assert_partition, pooled_std
from tests.regimes.scenario import FakeReceiver, make_group

EPS = 1e-6


def test_three_policies_hand_computed_pool_and_missing_prompts():
    # p0: pool = R [0,0] + S [1,0,1,1] + T [1] = [0,0,1,0,1,1,1]; mean 4/7,
    #     Σ(r-mean)^2 = 3·(4/7)^2 + 4·(3/7)^2 = 84/49 = 12/7, unbiased var 2/7, std 0.5345225
    #     Â(r=0) = (-4/7)/(0.5345225+1e-6) = -1.0690430
    # p1: pool = R [1,0] + S [1,1] (T missing) = [1,0,1,1]; mean 0.75, var 0.75/3 = 0.25, std 0.5
    #     Â = [0.25, -0.75] / 0.500001 = [0.4999990, -1.4999970]
    # p2: S only -> dropped "no_own_group"
    recv = FakeReceiver("r")
    own = [make_group("r", 0, [0, 0]), make_group("r", 1, [1, 0])]
    peers = {
        "s": [make_group("s", 0, [1, 0, 1, 1], kind="bpe"), make_group("s", 1, [1, 1], kind="bpe"),
              make_group("s", 2, [1], kind="bpe")],
        "t": [make_group("t", 0, [1])],
    }
    plan = plan_regime(get_regime("xgrpo"), recv, own, peers, 2)
    assert math.isclose(pooled_std([0, 0, 1, 0, 1, 1, 1]), math.sqrt(2 / 7), rel_tol=1e-12)
    s0 = math.sqrt(2 / 7)
    expected = torch.tensor([(-4 / 7) / (s0 + EPS)] * 2 + [0.25 / (0.5 + EPS), -0.75 / (0.5 + EPS)])
    torch.testing.assert_close(plan.batch.advantages, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(plan.batch.advantages[0], torch.tensor(-1.0690430), rtol=0, atol=2e-6)
    # only R's own rows, in R's tokenization, no peer rows
    ref = own_batch(recv, own)
    assert torch.equal(plan.batch.input_ids, ref.input_ids)
    assert not plan.batch.is_peer.any() and not plan.batch.needs_old_logp.any()
    assert plan.objective is None and plan.nll is None  # None: DAPO
    assert plan.mini_batches == split_rows(4, 2)
    assert_partition(plan)
    assert_flows(plan, peers, {"s": {"consumed": 6, "no_own_group": 1}, "t": {"consumed": 1}})
    metrics = flatten(plan.metrics)
    assert metrics["xgrpo/pooled_frac"] == 1.0
    assert metrics["xgrpo/pool_size"] == (7 + 4) / 2
    assert metrics["xgrpo/signal_frac"] == 1.0


def test_no_peers_is_plain_grpo():
    recv = FakeReceiver("r")
    own = [make_group("r", 0, [1, 0, 0]), make_group("r", 1, [1, 1, 1]), make_group("r", 2, [0.5, 0.25, 1])]
    plan = plan_regime(get_regime("xgrpo"), recv, own, {}, 3)
    r = torch.cat([g.rewards for g in own])
    gid = torch.tensor([0] * 3 + [1] * 3 + [2] * 3)
    torch.testing.assert_close(plan.batch.advantages, grpo_advantages(r, gid), rtol=0, atol=0)
    torch.testing.assert_close(plan.batch.advantages, torch.cat([g.advantages for g in own]), rtol=0, atol=0)
    base = plan_regime(get_regime("none"), recv, own, {}, 3)
    assert torch.equal(plan.batch.input_ids, base.batch.input_ids) and plan.mini_batches == base.mini_batches
    metrics = flatten(plan.metrics)
    assert plan.flows == {} and metrics["xgrpo/pooled_frac"] == 0.0
    assert metrics["xgrpo/adv_abs_diff"] == 0.0


def test_all_fail_receiver_gets_signal_from_all_pass_peer():
    # pool [0,0,1,1,1,1]: mean 2/3, Σ dev^2 = 2·4/9 + 4·1/9 = 4/3, var 4/15, std 0.5163978
    recv = FakeReceiver("r")
    own = [make_group("r", 0, [0, 0])]
    peers = {"s": [make_group("s", 0, [1, 1, 1, 1], kind="bpe")]}
    plan = plan_regime(get_regime("xgrpo"), recv, own, peers, 1)
    std = math.sqrt(4 / 15)
    torch.testing.assert_close(plan.batch.advantages, torch.full((2,), (-2 / 3) / (std + EPS)), rtol=0, atol=1e-6)
    assert torch.all(own[0].advantages == 0)  # plain GRPO gave no signal
    assert_flows(plan, peers, {"s": {"consumed": 4}})


def test_zero_variance_pool_and_size_one_pool_give_zero():
    recv = FakeReceiver("r")
    own = [make_group("r", 0, [1, 1]), make_group("r", 1, [1]), make_group("r", 2, [0])]
    # p0: pool [1,1,1,1,1] zero variance; p1: R alone, size 1 (peer missing); p2: pool [0, 1] (size 2)
    peers = {"s": [make_group("s", 0, [1, 1, 1], kind="bpe"), make_group("s", 2, [1], kind="bpe")]}
    plan = plan_regime(get_regime("xgrpo"), recv, own, peers, 2)
    # p2: mean 0.5, std sqrt(0.5) -> Â(0) = -0.5/(0.7071068+1e-6) = -0.7071058
    expected = torch.tensor([0.0, 0.0, 0.0, -0.5 / (math.sqrt(0.5) + EPS)])
    torch.testing.assert_close(plan.batch.advantages, expected, rtol=0, atol=1e-7)
    assert plan.batch.advantages[:3].eq(0).all()  # exactly zero
    assert_flows(plan, peers, {"s": {"consumed": 4}})
    assert_partition(plan)


def test_eps_is_configurable_and_args_validated():
    recv = FakeReceiver("r")
    own = [make_group("r", 0, [1, 0])]
    plan = plan_regime(get_regime("xgrpo", eps=0.5), recv, own, {}, 1)
    s = math.sqrt(0.5)
    torch.testing.assert_close(plan.batch.advantages, torch.tensor([0.5, -0.5]) / (s + 0.5), rtol=0, atol=1e-7)
    assert get_regime("xgrpo").subscribes == ("reward",)
    with pytest.raises(ValueError, match="unknown arguments"):
        get_regime("xgrpo", coef=1.0)
    with pytest.raises(ValueError, match="eps"):
        get_regime("xgrpo", eps=-1.0)
