"""Rollout correction (algorithms/rollout_correction.py, update/loop.py): the weights and the mismatch by hand, the
gradient reaching the behaviour term only (values unchanged), the update's gradient equal to a hand-written
token-mean loss with the weights on the behaviour term and the KL term unweighted, and the mismatch in the update's
logged metrics."""

from __future__ import annotations

import math

import pytest
import torch

from mutual_rl.algorithms import kl_penalty
from mutual_rl.algorithms.rollout_correction import behaviour_weighted, correction_weights
from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.policy import build_policy
from mutual_rl.rollout.hf import HFRolloutEngine
from mutual_rl.types import Problem, TrainingPlan, collate
from mutual_rl.update.config import GRPOConfig
from mutual_rl.update.loop import update_policy
from tests.module.helpers import TASK, spec

TRAINER = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
ENGINE = torch.tensor([[-1.5, -1.0, -0.5, -9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token is padding


def test_weights_and_mismatch_by_hand():
    # log w = 0.5, -1.0, 0 on the three tokens: w = e^0.5, e^-1, 1
    w_tis, m = correction_weights(TRAINER, ENGINE, MASK, "tis", 1.5)
    assert w_tis[0].tolist() == pytest.approx([1.5, math.exp(-1), 1.0, 1.0])  # capped at 1.5; 1 off the mask
    w_mis, _ = correction_weights(TRAINER, ENGINE, MASK, "mis", 1.5)
    assert w_mis.tolist() == [[0.0, 1.0, 1.0, 1.0]]  # e^0.5 = 1.65 > 1.5: masked
    w_none, _ = correction_weights(TRAINER, ENGINE, MASK, "none", 1.5)
    assert w_none.tolist() == [[1.0] * 4]
    assert m.logp_diff_mean == pytest.approx(0.5) and m.logp_diff_max == pytest.approx(1.0)
    k3 = ((math.exp(0.5) - 1 - 0.5) + (math.exp(-1) - 1 + 1) + 0.0) / 3
    assert m.kl_engine_trainer == pytest.approx(k3)
    assert m.weight_mean == pytest.approx((math.exp(0.5) + math.exp(-1) + 1) / 3)
    assert m.weight_max == pytest.approx(math.exp(0.5)) and m.over_cap == pytest.approx(1 / 3) and m.tokens == 3
    assert correction_weights(TRAINER, ENGINE, torch.zeros_like(MASK), "tis", 2.0)[1] is None


def test_behaviour_weighted_keeps_values_and_scales_gradients():
    x = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    w = torch.tensor([[0.5, 2.0, 0.0]])
    y = behaviour_weighted(x, w)
    assert torch.equal(y.detach(), x.detach())
    (y * torch.tensor([[1.0, 3.0, 5.0]])).sum().backward()
    assert x.grad.tolist() == [[0.5, 6.0, 0.0]]


@pytest.mark.parametrize("kw, match", [(dict(rollout_correction="tis", old_logp="rollout"), "old_logp: recompute"),
                                       (dict(rollout_correction="is"), "rollout_correction"),
                                       (dict(rollout_correction_cap=0.5), "rollout_correction_cap")])
def test_bad_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        GRPOConfig(**kw)


@pytest.fixture(scope="module")
def setup():
    task = ArithmeticTask(**TASK)
    policy = build_policy(spec("p", "tiny:llama-char"), task=task, needs_reference=True)
    policy.share_prompts = False
    policy.spec.optimizer.grad_clip = 0.0  # the captured gradients are the loss's own (no clipping)
    torch.manual_seed(0)
    problems = [Problem(i, t, "0", "add") for i, t in enumerate(["3+4=", "12+34=", "5-2="])]
    rollouts = [r for g in HFRolloutEngine().generate(policy, problems, policy.spec.sampling, step=0) for r in g]
    batch = collate(rollouts, torch.tensor([1.0, -1.0, 0.5, -0.5] * 3), policy.tokenizer.pad_token_id)
    with torch.no_grad():
        for q in policy.parameters():  # the reference differs from the policy: a KL gradient
            q.add_(torch.randn_like(q) * 1e-2)
    g = torch.Generator().manual_seed(3)
    engine = batch.old_logp + torch.randn(batch.old_logp.shape, generator=g) * 0.5 * batch.response_mask
    return policy, batch, engine


def _update(policy, batch, engine, **cfg):
    b = batch.select(list(range(len(batch))))
    b.old_logp = engine.clone()  # the engine's trace, which the recompute replaces
    params = [p for p in policy.parameters() if p.requires_grad]
    grads = []
    stats = update_policy(policy, TrainingPlan(b, [list(range(len(b)))]), GRPOConfig(num_mini_batches=1, **cfg),
                          backward=lambda loss: loss.backward(),
                          step_optimizer=lambda: grads.append([p.grad.detach().clone() for p in params]),
                          zero_grad=lambda: [setattr(p, "grad", None) for p in params])
    return grads[0], stats


def _hand_grads(policy, batch, engine, mode, cap, beta):
    """Token-mean loss: Σ w_t · (−min(ρA, clip(ρ)A)) + β · k3(π, ref), over the tokens, / their count."""
    params = [p for p in policy.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    with torch.no_grad():
        old, _ = policy.response_logp(batch.input_ids, batch.attention_mask, batch.response_width, 1.0)
        ref, _ = policy.response_logp(batch.input_ids, batch.attention_mask, batch.response_width, 1.0, reference=True)
    w = torch.exp(old - engine)
    w = w.clamp(max=cap) if mode == "tis" else (w <= cap).float()
    logp, _ = policy.response_logp(batch.input_ids, batch.attention_mask, batch.response_width, 1.0)
    ratio, adv = torch.exp(logp - old), batch.advantages[:, None]
    pg = -torch.min(ratio * adv, ratio.clamp(1 - 0.2, 1 + 0.28) * adv)
    mask = batch.response_mask
    ((w * pg + beta * kl_penalty(logp, ref, "k3")) * mask).sum().div(mask.sum()).backward()
    return [p.grad.detach().clone() for p in params]


@pytest.mark.parametrize("mode, cap", [("tis", 1.5), ("mis", 1.5)])
def test_update_weights_the_behaviour_term_only(setup, mode, cap):
    policy, batch, engine = setup
    got, stats = _update(policy, batch, engine, rollout_correction=mode, rollout_correction_cap=cap, kl_coef=0.3,
                         skip_zero_advantage=False)
    want = _hand_grads(policy, batch, engine, mode, cap, 0.3)
    plain, _ = _update(policy, batch, engine, kl_coef=0.3, skip_zero_advantage=False)
    assert max(float((a - b).abs().max()) for a, b in zip(got, plain)) > 1e-4  # the correction changed something
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    m = stats.rollout
    assert 0.2 < m.logp_diff_mean < 0.6 and m.kl_engine_trainer > 0.05 and 0.0 < m.over_cap < 0.5
    assert m.tokens == float(batch.response_mask.sum())
    logged = stats.metrics()
    assert logged["rollout/over_cap"] == m.over_cap and "rollout/kl_engine_trainer" in logged


def test_hf_engine_trace_has_no_mismatch(setup):
    policy, batch, _ = setup
    with torch.no_grad():  # an engine that computes exactly as the trainer: the recomputed log-probs themselves
        same, _ = policy.response_logp(batch.input_ids, batch.attention_mask, batch.response_width, 1.0)
    _, stats = _update(policy, batch, same * batch.response_mask, rollout_correction="tis")
    assert stats.rollout.logp_diff_max < 1e-5 and stats.rollout.over_cap == 0.0
    assert stats.rollout.weight_mean == pytest.approx(1.0, abs=1e-5)
