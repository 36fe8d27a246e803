"""F-TIS: truncated importance weights and the KL filter against hand-derived values, the ``FTISObjective`` (loss,
gradient, micro-batch invariance), the plan (pooled advantages, filtering, flows, shared vocabulary, repeated
prompts) and the update on tiny policies, alone and inside the trainer."""

from __future__ import annotations

import math

import pytest
import torch

from mutual_rl.algorithms.ftis import ftis_loss, kl_filter_keep, sequence_kl, tis_weights
from mutual_rl.regimes import get_regime
from mutual_rl.stats import flatten
from mutual_rl.step.scoring import plan_regime
from mutual_rl.types import PolicyBatch
from mutual_rl.update.config import GRPOConfig
from mutual_rl.update.objectives import FTISObjective, Norms
from tests.regimes.helpers_xsp import assert_flows, assert_partition
from tests.regimes.scenario import FakeReceiver, make_group

EPS = 1e-6
E = math.e


# ------------------------------------------------------------------------------------------- pure tensor math
def test_tis_weights_by_hand():
    # old − gen = [1, 0, −1.9, 25 -> clamp 20]: exp = [e, 1, e^-1.9, e^20]; cap 2 -> [2, 1, 0.1495686, 2]
    old = torch.tensor([[-1.0, -0.5, -2.0, -5.0]])
    gen = torch.tensor([[-2.0, -0.5, -0.1, -30.0]])
    w = tis_weights(old, gen, 2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, math.exp(-1.9), 2.0]]), rtol=0, atol=1e-7)
    torch.testing.assert_close(tis_weights(old, gen, 3.0)[0, 0], torch.tensor(E), rtol=0, atol=1e-6)
    assert not tis_weights(old.requires_grad_(True), gen, 2.0).requires_grad  # a constant of the step
    with pytest.raises(ValueError, match="is_cap"):
        tis_weights(old, gen, 0.0)


def test_sequence_kl_by_hand():
    # row 0: d = gen − old = [0.5, −0.2, (pad)]; row 1: d = [2, 30 -> clamp 20, 0]; row 2: no token
    gen = torch.tensor([[-0.5, -1.2, 9.0], [-1.0, -1.0, -2.0], [0.0, 0.0, 0.0]])
    old = torch.tensor([[-1.0, -1.0, 0.0], [-3.0, -31.0, -2.0], [-5.0, -5.0, -5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    k1 = sequence_kl(gen, old, mask, "k1")
    torch.testing.assert_close(k1, torch.tensor([0.15, 22.0 / 3, 0.0]), rtol=0, atol=1e-6)
    k3 = sequence_kl(gen, old, mask, "k3")  # exp(−d) + d − 1
    row0 = ((math.exp(-0.5) + 0.5 - 1) + (math.exp(0.2) - 0.2 - 1)) / 2
    row1 = ((math.exp(-2) + 2 - 1) + (math.exp(-20) + 20 - 1) + 0.0) / 3
    torch.testing.assert_close(k3, torch.tensor([row0, row1, 0.0]), rtol=0, atol=1e-6)
    k2 = sequence_kl(gen, old, mask, "k2")
    torch.testing.assert_close(k2[0], torch.tensor((0.125 + 0.02) / 2), rtol=0, atol=1e-7)
    with pytest.raises(ValueError, match="KL estimator"):
        sequence_kl(gen, old, mask, "k4")


def test_kl_filter_drops_only_negative_advantage_above_threshold():
    adv = torch.tensor([-1.0, -1.0, 0.0, 2.0, -0.5, -0.1])
    kl = torch.tensor([2.0, 0.5, 5.0, 5.0, 1.0, 1.0 + 1e-6])
    assert kl_filter_keep(adv, kl, 1.0).tolist() == [False, True, True, True, True, False]  # 1.0 is not > 1.0
    assert kl_filter_keep(adv, kl, None).all()
    assert kl_filter_keep(adv, kl, 0.0).tolist() == [False, False, True, True, False, False]


def peer_rows():
    """Two peer rows: ``old`` = π_R,old, ``gen`` = the generator's trace, logp = old (ρ = 1)."""
    old = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -0.6, 0.0]])
    gen = torch.tensor([[-2.0, -0.5, -0.1], [-0.3, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    return old, gen, mask


def test_ftis_loss_and_gradient_by_hand():
    # w = min(exp(old − gen), 2): row 0 [2, 1, e^-1.9], row 1 [1, e^0.4 = 1.4918247]; Â = [1.5, −2]; 5 tokens.
    # ρ = 1: loss_t = −w·Â, grad_t = −w·Â / 5.
    old, gen, mask = peer_rows()
    adv = torch.tensor([1.5, -2.0])
    logp = old.clone().requires_grad_(True)
    loss, m = ftis_loss(logp, old, gen, adv, mask, is_cap=2.0, token_count=mask.sum(), num_seqs=2)
    w = torch.tensor([[2.0, 1.0, math.exp(-1.9)], [1.0, math.exp(0.4), 0.0]])
    expected = -(w * adv.unsqueeze(-1) * mask) / 5
    assert loss.item() == pytest.approx(float(expected.sum()), abs=1e-7)
    loss.backward()
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-7)
    assert m["peer/is_weight_mean"].item() == pytest.approx(float((w * mask).sum() / 5), abs=1e-6)
    raw = [E, 1.0, math.exp(-1.9), 1.0, math.exp(0.4)]
    assert m["peer/is_ratio_mean"].item() == pytest.approx(sum(raw) / 5, abs=1e-6)
    assert m["peer/is_trunc_frac"].item() == pytest.approx(1 / 5)
    assert m["peer/ratio_mean"].item() == pytest.approx(1.0) and m["peer/approx_kl"].item() == pytest.approx(0.0)
    assert m["peer/num_tokens"].item() == 5


def test_ftis_loss_keeps_the_clip_and_weights_scale():
    old, gen, mask = peer_rows()
    # row 0: Â = +1, ρ = e^0.5 > 1.28 -> clipped, no gradient; row 1: Â = −1, ρ = e^-0.5 < 0.8 -> clipped too
    logp0 = old + torch.tensor([[0.5, 0.5, 0.5], [-0.5, -0.5, 0.0]])
    logp = logp0.clone().requires_grad_(True)
    loss, m = ftis_loss(logp, old, gen, torch.tensor([1.0, -1.0]), mask, is_cap=2.0, token_count=5.0, num_seqs=2)
    loss.backward()
    assert logp.grad.eq(0).all()
    assert m["peer/clip_frac_high"].item() == pytest.approx(3 / 5) and m["peer/clip_frac_low"].item() == pytest.approx(2 / 5)
    # inside the clip range: ρ = e^0.1; grad_t = −w·Â·ρ·seq_weight / 5 with sequence weights [0.5, 1]
    logp0 = old + 0.1
    logp = logp0.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    ftis_loss(logp, old, gen, adv, mask, is_cap=2.0, token_count=5.0, num_seqs=2,
              weights=torch.tensor([0.5, 1.0]))[0].backward()
    w = torch.tensor([[2.0, 1.0, math.exp(-1.9)], [1.0, math.exp(0.4), 0.0]])
    expected = -w * adv.unsqueeze(-1) * math.exp(0.1) * torch.tensor([[0.5], [1.0]]) * mask / 5
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-7)


def tiny_batch():
    """Row 0: own (Â = −1, ρ = 1); rows 1, 2: peer with π_R,old ``old`` and generator trace ``gen``."""
    old, gen, mask = peer_rows()
    full_mask = torch.cat([torch.tensor([[1.0, 1.0, 0.0]]), mask])
    full_old = torch.cat([torch.tensor([[-0.7, -0.2, 0.0]]), old])
    batch = PolicyBatch(
        input_ids=torch.zeros(3, 5, dtype=torch.long), attention_mask=torch.ones(3, 5, dtype=torch.long),
        response_mask=full_mask, old_logp=full_old, advantages=torch.tensor([-1.0, 1.5, -2.0]), weights=torch.ones(3),
        is_peer=torch.tensor([False, True, True]), prompt_ids=[0, 0, 0],
        gen_logp=torch.cat([torch.zeros(1, 3), gen]),
    )
    return batch, full_old.clone()


def test_ftis_objective_by_hand():
    # 7 tokens; own: −Â·ρ = 1 per token, grad −Â/7 = 1/7; peer: −w·Â, grad −w·Â/7
    batch, logp0 = tiny_batch()
    logp = logp0.clone().requires_grad_(True)
    objective = FTISObjective(is_cap=2.0).with_algorithm(GRPOConfig().dapo())
    loss, m = objective.loss(logp, batch, Norms(batch.response_mask.sum(), 3, 3))
    w = torch.tensor([[2.0, 1.0, math.exp(-1.9)], [1.0, math.exp(0.4), 0.0]])
    peer = -(w * torch.tensor([[1.5], [-2.0]]) * batch.response_mask[1:])
    assert loss.item() == pytest.approx((2.0 + float(peer.sum())) / 7, abs=1e-7)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.cat([torch.tensor([[1 / 7, 1 / 7, 0.0]]), peer / 7]), rtol=0, atol=1e-7)
    assert m.own.ratio_mean.item() == pytest.approx(1.0) and m.own.num_tokens.item() == 2
    assert m.peer.num_tokens.item() == 5 and m.rows.approx_kl.item() == pytest.approx(0.0, abs=1e-7)
    assert m.own.approx_kl.item() == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("kl", [0.0, 0.1])
def test_ftis_objective_is_micro_batch_invariant(agg, kl):
    batch, logp0 = tiny_batch()
    logp0 = logp0 + torch.tensor([[0.05, -0.1, 0.0], [0.1, -0.05, 0.2], [-0.1, 0.15, 0.0]])  # ρ ≠ 1
    ref = logp0 - 0.3
    cfg = GRPOConfig(agg=agg, kl_coef=kl)
    fn = FTISObjective(is_cap=2.0).with_algorithm(cfg.dapo())
    tc, ns = batch.response_mask.sum(), 3
    whole = logp0.clone().requires_grad_(True)
    loss_whole, _ = fn.loss(whole, batch, Norms(tc, ns, 3), ref)
    loss_whole.backward()
    parts = logp0.clone().requires_grad_(True)
    total = 0.0
    for rows in ([0], [1], [2]):
        loss, _ = fn.loss(parts[rows], batch.select(rows), Norms(tc, ns, 3), ref[rows])
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(loss_whole.item(), abs=1e-7)
    torch.testing.assert_close(parts.grad, whole.grad, rtol=0, atol=1e-7)
    again, _ = fn.loss(logp0.clone(), batch, Norms(None, None, 3), ref)
    assert again.item() == pytest.approx(loss_whole.item(), abs=1e-7)


# ------------------------------------------------------------------------------------------------- the plan
def scenario(receiver_logp=-3.0):
    recv = FakeReceiver("r", logp_fn=lambda ids, w: torch.full((ids.shape[0], w), receiver_logp))
    own = [make_group("r", 0, [0, 0])]
    # S (bpe: '1','2',' ','3','4',EOS) answers "12 34" (reward 1) and "47" (reward 0) with scripted traces
    peers = {"s": [make_group("s", 0, [1, 0], kind="bpe", texts=["12 34", "47"],
                              logps=[[-0.1, -0.3, -0.2, -0.4, -0.6, -0.8], [-1.0, -2.0, -3.0]])]}
    return recv, own, peers


def test_plan_filters_the_off_policy_negative_sample():
    # pool [0,0,1,0]: Â = (r − 0.25) / (0.5 + ε) -> peer "12 34" +0.75/0.500001, "47" −0.25/0.500001.
    # π_R,old = −3 per token; span alignment (identical spans) gives the trace back. k1 KL:
    #   "12 34": mean(gen) + 3 = −2.4/6 + 3 = 2.6 (kept: Â > 0); "47": −6/3 + 3 = 1.0 > 0.5, Â < 0 -> filtered
    recv, own, peers = scenario()
    plan = plan_regime(get_regime("ftis", kl_threshold=0.5, is_cap=1.5), recv, own, peers, 1)
    b = plan.batch
    assert_flows(plan, peers, {"s": {"consumed": 1, "kl_filtered": 1}})
    assert_partition(plan)
    assert b.is_peer.tolist() == [False, False, True] and b.needs_old_logp.tolist() == [False] * 3
    torch.testing.assert_close(b.advantages, torch.tensor([-0.25, -0.25, 0.75]) / (0.5 + EPS), rtol=0, atol=1e-7)
    torch.testing.assert_close(b.gen_logp[2, :6], torch.tensor([-0.1, -0.3, -0.2, -0.4, -0.6, -0.8]))
    assert b.gen_logp[:2].eq(0).all()
    torch.testing.assert_close(b.old_logp[2, :6], torch.full((6,), -3.0))  # π_R,old, never recomputed
    assert b.is_peer.tolist() == [False, False, True]
    assert plan.objective == FTISObjective(is_cap=1.5)  # DAPO's terms: the algorithm's
    assert len(plan.crossed) == 2  # both were crossed (residual report), one trained
    assert flatten(plan.metrics) == {
        "ftis/peer_rows": 1.0, "ftis/peer_frac": pytest.approx(1 / 3), "ftis/pool_size": 4.0,
        "ftis/filtered": 1.0, "ftis/filtered_frac": 0.5, "ftis/neg_frac": 0.5,
        "ftis/peer_adv_mean": pytest.approx(0.75 / (0.5 + EPS), abs=1e-6),
        "ftis/peer_kl_mean": pytest.approx(1.8, abs=1e-6), "ftis/peer_kl_max": pytest.approx(2.6, abs=1e-6),
    }
    # threshold 1.0: "47" has KL exactly 1.0, not above it -> kept; no filter keeps it too
    for kw in ({"kl_threshold": 1.0}, {"kl_threshold": None}):
        plan = plan_regime(get_regime("ftis", **kw), recv, own, peers, 1)
        assert_flows(plan, peers, {"s": {"consumed": 2}})
    # k3 instead: "47" d = gen + 3 = [2, 1, 0] -> mean(e^-d + d − 1) = (e^-2 + 1 + e^-1 + 0 + 0) / 3 = 0.501071
    plan = plan_regime(get_regime("ftis", kl_threshold=0.5, filter_kl="k3"), recv, own, peers, 1)
    assert plan.flows == {"s": {"consumed": 1, "kl_filtered": 1}}
    plan = plan_regime(get_regime("ftis", kl_threshold=0.502, filter_kl="k3"), recv, own, peers, 1)
    assert plan.flows == {"s": {"consumed": 2}}


def test_shared_vocabulary_uses_the_peer_trace_directly_and_word_alignment_otherwise():
    trace = [-0.2, -0.4, -0.6, -0.8, -1.0, -0.1, -0.3, -0.5, -0.7, -0.9, -1.1]  # "he","l","l","o"," ","w",...,EOS
    same = FakeReceiver("r", kind="bpe")
    peers = {"s": [make_group("s", 0, [1], kind="bpe", texts=["hello world"], logps=[trace])]}
    own = [make_group("r", 0, [0], kind="bpe")]
    plan = plan_regime(get_regime("ftis", granularity="word", kl_threshold=None), same, own, peers, 1)
    torch.testing.assert_close(plan.batch.gen_logp[1, :11], torch.tensor(trace), rtol=0, atol=0)  # as is
    # a char receiver: "hello" + " world" + EOS in word groups, each group's mass spread over its char tokens
    char = FakeReceiver("r")
    plan = plan_regime(get_regime("ftis", granularity="word", kl_threshold=None), char, [make_group("r", 0, [0])], peers, 1)
    hello, world = sum(trace[:4]) / 5, sum(trace[4:]) / 7  # 'he' (2 chars) + l + l + o; ' world' + EOS
    torch.testing.assert_close(plan.batch.gen_logp[1, :12], torch.tensor([hello] * 5 + [world] * 7))


def test_source_advantages_and_no_peers():
    recv, own, peers = scenario(receiver_logp=-0.5)
    peers["s"] = [make_group("s", 0, [1, 0], kind="bpe", texts=["12 34", "47"], advantages=[0.3, -0.7])]
    reg = get_regime("ftis", advantage="source")
    assert reg.subscribes == ("rollout", "reward", "advantage")
    assert get_regime("ftis").subscribes == ("rollout", "reward")
    plan = plan_regime(reg, recv, own, peers, 1)
    torch.testing.assert_close(plan.batch.advantages, torch.tensor([0.0, 0.0, 0.3, -0.7]))
    base = plan_regime(get_regime("none"), recv, own, {}, 2)
    plan = plan_regime(get_regime("ftis"), recv, own, {}, 2)
    assert plan.objective is None and plan.flows == {} and plan.batch.gen_logp is None  # None: DAPO
    assert torch.equal(plan.batch.input_ids, base.batch.input_ids) and plan.mini_batches == base.mini_batches
    metrics = flatten(plan.metrics)
    assert "ftis/peer_kl_mean" not in metrics and metrics["ftis/peer_rows"] == 0.0


def test_repeated_prompt_pairs_each_slot_with_its_own_peer_group():
    recv = FakeReceiver("r", logp_fn=lambda ids, w: torch.full((ids.shape[0], w), -3.0))
    own = [make_group("r", 7, [0, 0], group_id=100), make_group("r", 7, [1, 0], group_id=101)]
    peers = {"s": [make_group("s", 7, [0, 0], kind="bpe", group_id=101),  # delivered out of order
                   make_group("s", 7, [1, 0], kind="bpe", group_id=100),
                   make_group("s", 9, [1, 0], kind="bpe", group_id=102)]}
    plan = plan_regime(get_regime("ftis", kl_threshold=0.5), recv, own, peers, 2)
    # slot 100 pools [0,0 | 1,0]; slot 101 pools [1,0 | 0,0]: Â = ±(0.75 or 0.25)/(0.5+ε); default traces −0.5 per
    # token vs π_R,old = −3: k1 KL = 2.5 > 0.5 -> each slot's negative-advantage peer response is filtered
    a = torch.tensor([-0.25, -0.25, 0.75, 0.75, -0.25]) / (0.5 + EPS)
    torch.testing.assert_close(plan.batch.advantages, a, rtol=0, atol=1e-7)
    assert plan.batch.is_peer.tolist() == [False, False, True, False, False]
    assert plan.batch.prompt_ids == [7] * 5
    assert_flows(plan, peers, {"s": {"consumed": 1, "kl_filtered": 3, "no_own_group": 2}})
    metrics = flatten(plan.metrics)
    assert metrics["ftis/filtered"] == 3.0 and metrics["ftis/pool_size"] == 4.0


def test_args_validated():
    for kw, msg in (({"is_cap": 0.0}, "is_cap"), ({"kl_threshold": -1.0}, "kl_threshold"),
                    ({"filter_kl": "k4"}, "filter_kl"), ({"advantage": "mean"}, "advantage"),
                    ({"granularity": "char"}, "granularity"), ({"eps": -1.0}, "eps")):
        with pytest.raises(ValueError, match=msg):
            get_regime("ftis", **kw)


# ------------------------------------------------------------------------------------------------ the update
def _tiny_policy():
    from mutual_rl.model.policy import build_policy
    from mutual_rl.model.spec import PolicySpec, WarmStart

    return build_policy(PolicySpec(name="r", model="tiny:llama-char", warmstart=WarmStart(steps=5)))


def _update(policy, plan, cfg, lr=0.01):
    from mutual_rl.update.loop import update_policy

    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=lr)
    return update_policy(policy, plan, cfg, backward=lambda loss: loss.backward(), step_optimizer=opt.step,
                         zero_grad=lambda: opt.zero_grad(set_to_none=True))


def test_update_on_a_tiny_policy_and_micro_batches_change_nothing():
    policy = _tiny_policy()
    _, own, peers = scenario()
    plan = plan_regime(get_regime("ftis", kl_threshold=None), policy, own, peers, 1)
    assert plan.objective == FTISObjective(is_cap=2.0) and plan.batch.is_peer.sum() == 2
    params = [p for p in policy.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    m = _update(policy, plan, GRPOConfig(num_mini_batches=1))
    after = [p.detach().clone() for p in params]
    assert any(not torch.equal(a, b) for a, b in zip(after, before))
    assert m.tokens.peer.ratio_mean == pytest.approx(1.0, abs=1e-5)  # old_logp = π_R,old of this step
    b = plan.batch.select([2, 3])
    w = torch.exp(b.old_logp - b.gen_logp).clamp(max=2.0)
    assert m.tokens.peer.is_weight_mean == pytest.approx(float((w * b.response_mask).sum() / b.response_mask.sum()),
                                                     rel=1e-5)
    # the same update in micro-batches of one row: the same weights after the step
    with torch.no_grad():
        for p, b0 in zip(params, before):
            p.copy_(b0)
    plan = plan_regime(get_regime("ftis", kl_threshold=None), policy, own, peers, 1)
    _update(policy, plan, GRPOConfig(num_mini_batches=1, micro_batch_size=1))
    for p, a in zip(params, after):
        torch.testing.assert_close(p.detach(), a, rtol=0, atol=1e-6)


def test_two_trainer_steps_train_and_account_for_every_response(tmp_path):
    import lightning.pytorch as pl

    from mutual_rl.exchange import ExperienceExchange
    from mutual_rl.module import MutualRLModule
    from tests.module.helpers import RecordMetrics, datamodule, pair, trainer

    pl.seed_everything(0)
    m = MutualRLModule(pair(), algorithm=GRPOConfig(num_mini_batches=2), regime=get_regime("ftis", kl_threshold=0.0),
                       reward="test_parity", log_samples_every_n_steps=0)
    dm = datamodule()
    trainer(tmp_path, max_steps=0).fit(m, datamodule=dm)  # builds the policies
    before = {k: v.detach().clone() for k, v in m.named_parameters() if v.requires_grad}
    rec, ex = RecordMetrics(), ExperienceExchange()
    trainer(tmp_path, max_steps=2, callbacks=[rec, ex]).fit(m, datamodule=dm)
    for name in ("gpt2", "llama"):
        assert any(k.startswith(f"policies.{name}.") and not torch.equal(before[k], v)
                   for k, v in m.named_parameters() if v.requires_grad), name
        assert all(f"{name}/ftis/peer_rows" in r for r in rec.rows)
    totals = ex.totals()
    assert set(totals) == {"gpt2->llama", "llama->gpt2"}
    for flow, counts in totals.items():
        assert counts["delivered"] == 2 * 4 * 4  # 2 steps x 4 prompts x 4 responses
        dropped = sum(v for k, v in counts.items() if k.startswith("dropped/"))
        assert counts.get("consumed", 0) + dropped == counts["delivered"], flow
        assert set(k for k in counts if k.startswith("dropped/")) <= {"dropped/kl_filtered"}, counts
    filtered = sum(r[f"{n}/ftis/filtered"] for r in rec.rows for n in ("gpt2", "llama"))
    assert filtered == sum(c.get("dropped/kl_filtered", 0) for c in totals.values()) > 0
