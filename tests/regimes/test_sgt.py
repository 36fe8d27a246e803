"""SGT: gate, seeded uniform draw among all peers' successes, NLL term placement, flows, and the update."""

from __future__ import annotations

import random

import pytest
import torch

from mutual_rl.regimes import get_regime
from mutual_rl.regimes.base import own_batch, split_rows
from mutual_rl.regimes.sgt import draw_index, spread_rows
from mutual_rl.stats import flatten
from mutual_rl.step.scoring import plan_regime
from tests.regimes.helpers_xsp import assert_flows, assert_partition
from tests.regimes.scenario import FakeReceiver, make_group


def char_ids(recv, text):
    return recv.tokenizer(text, add_special_tokens=False)["input_ids"] + [recv.tokenizer.eos_token_id]


def row_ids(batch, row):
    return batch.input_ids[row, -batch.response_width:][batch.response_mask[row].bool()].tolist()


def test_gate_flows_and_nll_term_two_policies():
    recv = FakeReceiver("r")
    own = [make_group("r", 0, [0, 0]), make_group("r", 1, [1, 0]), make_group("r", 2, [0, 0])]
    peers = {"s": [
        make_group("s", 0, [1, 0, 1], kind="bpe", texts=["46", "47", "64"]),  # gated: 2 successes, 1 failure
        make_group("s", 1, [1, 1], kind="bpe"),  # R has a success: gate closed
        make_group("s", 2, [0, 0], kind="bpe"),  # no peer success: gate closed
        make_group("s", 3, [1], kind="bpe"),  # R has no group for prompt 3
    ]}
    plan = plan_regime(get_regime("sgt"), recv, own, peers, 1)
    # R's own GRPO batch unchanged
    ref = own_batch(recv, own)
    for f in ("input_ids", "attention_mask", "response_mask", "old_logp", "advantages", "is_peer"):
        assert torch.equal(getattr(plan.batch, f), getattr(ref, f)), f
    assert plan.objective is None and plan.mini_batches == [list(range(6))]
    # the draw: candidates [s#0 "46", s#2 "64"], index Random("0:0:r:0").randrange(2) = 1 -> "64"
    assert random.Random("0:0:r:0").randrange(2) == 1
    nll = plan.nll
    assert nll.coef == 0.1 and len(nll.batch) == 1 and nll.mini_batches == [[0]]
    assert row_ids(nll.batch, 0) == char_ids(recv, "64")
    assert nll.batch.input_ids[0, : nll.batch.input_ids.shape[1] - nll.batch.response_width].tolist() == \
        own[0].rollouts[0].prompt_ids.tolist()
    assert nll.batch.prompt_ids == [0] and bool(nll.batch.is_peer[0])
    assert_flows(plan, peers, {"s": {"consumed": 1, "not_drawn": 1, "not_success": 1, "gate_closed": 4,
                                     "no_own_group": 1}})
    metrics = flatten(plan.metrics)
    assert metrics == {"rescued/s": 1.0, "rescued": 1.0, "gate_rate": 1 / 3, "all_fail_frac": 2 / 3}


def _three_policy_scenario(step=0):
    recv = FakeReceiver("r")
    own = [make_group("r", 0, [0, 0], step=step)]
    # delivered in the order t, s: the candidates are ordered by source name: [s#0 "10", s#2 "30", t#1 "50"]
    peers = {
        "t": [make_group("t", 0, [0, 1], kind="char", texts=["40", "50"])],
        "s": [make_group("s", 0, [1, 0, 1], kind="bpe", texts=["10", "20", "30"])],
    }
    return recv, own, peers


@pytest.mark.parametrize("seed, text, source", [(0, "30", "s"), (7, "50", "t")])
def test_draw_is_among_all_peers_successes_pooled(seed, text, source):
    # seed 0: Random("0:0:r:0").randrange(3) = 1 -> s#2 "30"; seed 7: Random("7:0:r:0").randrange(3) = 2 -> t#1
    assert random.Random(f"{seed}:0:r:0").randrange(3) == {"s": 1, "t": 2}[source]
    recv, own, peers = _three_policy_scenario()
    plan = plan_regime(get_regime("sgt", seed=seed), recv, own, peers, 1)
    assert row_ids(plan.nll.batch, 0) == char_ids(recv, text)
    other = "t" if source == "s" else "s"
    metrics = flatten(plan.metrics)
    assert metrics[f"rescued/{source}"] == 1.0 and metrics[f"rescued/{other}"] == 0.0
    assert plan.flows[source]["consumed"] == 1 and "consumed" not in plan.flows[other]
    assert plan.flows["s"]["not_success"] == 1 and plan.flows["t"]["not_success"] == 1
    assert plan.flows["s"].get("not_drawn", 0) + plan.flows["t"].get("not_drawn", 0) == 2
    assert_flows(plan, peers)


def test_draw_is_deterministic_and_varies_with_step_and_seed():
    drawn = {}
    for seed in range(12):
        for step in range(3):
            recv, own, peers = _three_policy_scenario(step)
            a = plan_regime(get_regime("sgt", seed=seed), recv, own, peers, 1)
            b = plan_regime(get_regime("sgt", seed=seed), recv, own, dict(reversed(list(peers.items()))), 1)
            assert row_ids(a.nll.batch, 0) == row_ids(b.nll.batch, 0)  # same seed, any peer order: same draw
            drawn[seed, step] = tuple(row_ids(a.nll.batch, 0))
            assert draw_index(seed, step, "r", 0, 3) == random.Random(f"{seed}:{step}:r:0").randrange(3)
    assert len({drawn[0, s] for s in range(3)}) > 1  # another step can draw another success
    assert len(set(drawn.values())) == 3  # every success (of both sources) gets drawn for some (seed, step)


def test_nll_rows_spread_evenly_over_the_updates():
    recv = FakeReceiver("r")
    own = [make_group("r", p, [0, 0]) for p in range(4)]  # rows 0-1, 2-3, 4-5, 6-7
    peers = {"s": [make_group("s", p, [1], kind="bpe") for p in (3, 1, 0)]}
    plan = plan_regime(get_regime("sgt"), recv, own, peers, 3)
    assert plan.mini_batches == split_rows(8, 3) == [[0, 1, 2], [3, 4], [5, 6, 7]]
    assert plan.nll.batch.prompt_ids == [0, 1, 3]  # in R's prompt order
    # 3 rescued over 3 updates: one each, placed by the seeded permutation (not by where R's group lies)
    assert sorted(len(rows) for rows in plan.nll.mini_batches) == [1, 1, 1]
    assert sorted(r for rows in plan.nll.mini_batches for r in rows) == [0, 1, 2]
    step = int(own[0].rollouts[0].step)
    assert plan.nll.mini_batches == spread_rows(3, 3, 0, step, "r")
    assert_partition(plan)
    assert_flows(plan, peers, {"s": {"consumed": 3}})
    metrics = flatten(plan.metrics)
    assert metrics["gate_rate"] == 3 / 4 and metrics["rescued/s"] == 3.0


@pytest.mark.parametrize("rows, updates", [(0, 1), (1, 4), (3, 4), (4, 4), (5, 2), (7, 3), (9, 1)])
def test_spread_rows_is_an_even_partition(rows, updates):
    spread = spread_rows(rows, updates, seed=0, step=3, receiver="r")
    assert len(spread) == updates
    assert sorted(r for part in spread for r in part) == list(range(rows))  # each row exactly once
    # round-robin from update 0: update i holds ceil((rows - i) / updates)
    assert [len(part) for part in spread] == [-(-(rows - i) // updates) for i in range(updates)]
    assert spread == spread_rows(rows, updates, seed=0, step=3, receiver="r")  # deterministic


def test_spread_rows_order_is_seeded():
    seen = {tuple(map(tuple, spread_rows(4, 4, seed, step, "r"))) for seed in range(3) for step in range(4)}
    assert len(seen) > 1  # the permutation varies with seed and step
    with pytest.raises(ValueError, match="at least one update"):
        spread_rows(2, 0, 0, 0, "r")


def test_size_one_groups_all_pass_peer_threshold_and_coef():
    recv = FakeReceiver("r")
    own = [make_group("r", 0, [0]), make_group("r", 1, [0.5])]
    peers = {"s": [make_group("s", 0, [1, 1, 1], kind="bpe"), make_group("s", 1, [1, 1], kind="bpe")]}
    plan = plan_regime(get_regime("sgt", coef=0.25), recv, own, peers, 2)
    # threshold 0: R succeeds on prompt 1 (0.5 > 0) -> gate closed there
    assert plan.nll.coef == 0.25 and plan.nll.batch.prompt_ids == [0] and plan.nll.mini_batches == [[0], []]
    assert_flows(plan, peers, {"s": {"consumed": 1, "not_drawn": 2, "gate_closed": 2}})
    # threshold 0.5: 0.5 is not a success -> both prompts gated
    regime = get_regime("sgt")
    regime.success_threshold = 0.5  # set by the module from algorithm.success_threshold
    plan = plan_regime(regime, recv, own, peers, 2)
    assert plan.nll.batch.prompt_ids == [0, 1] and sorted(plan.nll.mini_batches) == [[0], [1]]
    assert_flows(plan, peers, {"s": {"consumed": 2, "not_drawn": 3}})


def test_no_peers_is_plain_grpo_and_no_rescue_means_no_nll():
    recv = FakeReceiver("r")
    own = [make_group("r", 0, [0, 0]), make_group("r", 1, [1, 0])]
    plan = plan_regime(get_regime("sgt"), recv, own, {}, 2)
    base = plan_regime(get_regime("none"), recv, own, {}, 2)
    assert plan.nll is None and plan.flows == {} and plan.mini_batches == base.mini_batches
    assert torch.equal(plan.batch.advantages, base.batch.advantages)
    assert flatten(plan.metrics) == {"rescued": 0.0, "gate_rate": 0.0, "all_fail_frac": 0.5}
    peers = {"s": [make_group("s", 0, [0, 0], kind="bpe"), make_group("s", 1, [1, 1], kind="bpe")]}
    plan = plan_regime(get_regime("sgt"), recv, own, peers, 2)
    assert plan.nll is None
    assert_flows(plan, peers, {"s": {"gate_closed": 4}})


def test_applies_in_every_direction():
    a = [make_group("a", 0, [0, 0]), make_group("a", 1, [1, 0])]
    b = [make_group("b", 0, [1, 0], kind="bpe"), make_group("b", 1, [0, 0], kind="bpe")]
    pa = plan_regime(get_regime("sgt"), FakeReceiver("a"), a, {"b": b}, 1)
    pb = plan_regime(get_regime("sgt"), FakeReceiver("b", kind="bpe"), b, {"a": a}, 1)
    assert pa.nll.batch.prompt_ids == [0] and pb.nll.batch.prompt_ids == [1]
    assert_flows(pa, {"b": b}, {"b": {"consumed": 1, "not_success": 1, "gate_closed": 2}})
    assert_flows(pb, {"a": a}, {"a": {"consumed": 1, "not_success": 1, "gate_closed": 2}})


def test_args_validated():
    assert get_regime("sgt").subscribes == ("rollout", "reward")
    with pytest.raises(ValueError, match="unknown arguments"):
        get_regime("sgt", lam=0.1)
    with pytest.raises(ValueError, match="coef"):
        get_regime("sgt", coef=-0.1)


def test_update_moves_parameters_along_minus_grad_nll():
    """All-fail receiver group (zero advantages, skipped): the step is exactly SGD on λ·NLL of the rescued row."""
    from mutual_rl.model.policy import build_policy
    from mutual_rl.model.spec import PolicySpec, WarmStart
    from mutual_rl.update.config import GRPOConfig
    from mutual_rl.update.loop import update_policy

    policy = build_policy(PolicySpec(name="r", model="tiny:llama-char", warmstart=WarmStart(steps=5)))
    policy.spec.optimizer.grad_clip = 0.0
    own = [make_group("r", 0, [0, 0]), make_group("r", 1, [0, 0])]
    peers = {"s": [make_group("s", 0, [1, 0], kind="bpe", texts=["46", "47"]),
                   make_group("s", 1, [0, 1], kind="bpe", texts=["12", "35"])]}
    plan = plan_regime(get_regime("sgt", coef=0.1), policy, own, peers, 2)
    assert sorted(plan.nll.mini_batches) == [[0], [1]]
    params = [p for p in policy.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]

    # expected: two optimizer steps (one per mini-batch), each SGD on λ = 0.1 times the NLL of the one rescued row
    # its mini-batch holds (λ · the mean NLL of the update's rescued rows: the objective holds per update)
    lr = 0.05
    opt = torch.optim.SGD(params, lr=lr)
    expected = []
    for i, (row,) in enumerate(plan.nll.mini_batches):
        sub = plan.nll.batch.select([row])
        logp, _ = policy.response_logp(sub.input_ids, sub.attention_mask, plan.nll.batch.response_width, 1.0)
        nll = -(logp * sub.response_mask).sum() / sub.response_mask.sum()
        grads = torch.autograd.grad(0.1 * nll, params, allow_unused=True)
        expected.append([torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)])
        if i == 0:  # the second row's gradient is taken after the first step
            with torch.no_grad():
                for p, g in zip(params, expected[0]):
                    p -= lr * g
    with torch.no_grad():  # restore
        for p, b0 in zip(params, before):
            p.copy_(b0)

    def zero():
        for p in params:
            p.grad = None

    m = update_policy(policy, plan, GRPOConfig(num_mini_batches=2, old_logp="rollout"),
                      backward=lambda loss: loss.backward(), step_optimizer=opt.step, zero_grad=zero)
    assert m.skipped_frac == 1.0 and m.nll > 0
    changed = False
    for p, b0, g0, g1 in zip(params, before, *expected):
        torch.testing.assert_close(p.detach(), b0 - lr * (g0 + g1), rtol=0, atol=1e-6)
        changed |= bool((p.detach() != b0).any())
    assert changed


def _grads_per_update(policy, plan, cfg):
    """Run ``update_policy`` with lr 0 (parameters stay put) and return each optimizer update's gradients."""
    from mutual_rl.update.loop import update_policy

    params = [p for p in policy.parameters() if p.requires_grad]
    grads = []

    def step():
        grads.append([torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params])

    def zero():
        for p in params:
            p.grad = None

    update_policy(policy, plan, cfg, backward=lambda loss: loss.backward(), step_optimizer=step, zero_grad=zero)
    return params, grads


@pytest.mark.parametrize("num_mini_batches", [1, 2, 4])
def test_nll_part_of_each_update_is_lambda_times_its_rescued_rows_nll_gradient(num_mini_batches):
    """SGT's objective holds per update: for M = 1, 2, 4 mini-batches, the NLL part of each update's gradient (that
    update's gradient minus the same update without the NLL term) equals ``λ ·`` the gradient of the mean NLL of the
    rescued rows it holds, to 1e-6; the GRPO rows are live (mixed groups), and with 2 PPO epochs every rescued
    response is used exactly once per epoch."""
    import dataclasses

    from mutual_rl.model.policy import build_policy
    from mutual_rl.model.spec import PolicySpec, WarmStart
    from mutual_rl.update.config import GRPOConfig

    policy = build_policy(PolicySpec(name="r", model="tiny:llama-char", warmstart=WarmStart(steps=5)))
    policy.spec.optimizer.grad_clip = 0.0
    texts = ["46", "12", "35", "99", "7", "81"]
    # 6 all-fail prompts (rescued) and 2 mixed ones (live GRPO rows): 16 own rows
    own = [make_group("r", q, [0, 0]) for q in range(6)] + [make_group("r", q, [1, 0]) for q in (6, 7)]
    peers = {"s": [make_group("s", q, [1, 0], kind="bpe", texts=[texts[q], "0"]) for q in range(6)]}
    lam = 0.2
    plan = plan_regime(get_regime("sgt", coef=lam), policy, own, peers, num_mini_batches)
    assert flatten(plan.metrics)["rescued"] == 6.0
    spread = plan.nll.mini_batches
    assert [len(rows) for rows in spread] == {1: [6], 2: [3, 3], 4: [2, 2, 1, 1]}[num_mini_batches]
    cfg = GRPOConfig(num_mini_batches=num_mini_batches, ppo_epochs=2, old_logp="rollout")
    params, with_nll = _grads_per_update(policy, plan, cfg)
    _, without = _grads_per_update(policy, dataclasses.replace(plan, nll=None), cfg)
    assert len(with_nll) == len(without) == 2 * num_mini_batches  # two epochs of M updates
    b = plan.nll.batch
    used = []
    for u in range(2 * num_mini_batches):
        rows = spread[u % num_mini_batches]
        used += rows
        sub = b.select(rows)
        logp, _ = policy.response_logp(sub.input_ids, sub.attention_mask, b.response_width, 1.0)
        nll = (-(logp * sub.response_mask).sum(-1) / sub.response_mask.sum(-1)).mean()
        expected = torch.autograd.grad(lam * nll, params, allow_unused=True)
        for p, g, g_with, g_without in zip(params, expected, with_nll[u], without[u]):
            torch.testing.assert_close(g_with - g_without, torch.zeros_like(p) if g is None else g,
                                       rtol=0, atol=1e-6)
    assert sorted(used) == sorted(2 * list(range(6)))  # every rescued response exactly once per epoch
    assert any(bool(g.abs().sum() > 0) for g in without[num_mini_batches - 1])  # the mixed groups: GRPO is live
