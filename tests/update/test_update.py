"""The update path of one policy: micro-batching and the zero-advantage skip change no gradient."""

from __future__ import annotations

import pytest
import torch

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.policy import build_policy
from mutual_rl.regimes.base import split_rows
from mutual_rl.rollout.hf import HFRolloutEngine
from mutual_rl.types import TrainingPlan, collate
from mutual_rl.update.config import GRPOConfig
from mutual_rl.update.loop import update_policy
from tests.module.helpers import TASK, spec


@pytest.fixture(scope="module", params=["tiny:gpt2-bpe", "tiny:llama-char"])
def policy_and_batch(request):
    policy = build_policy(spec("p", request.param), task=ArithmeticTask(**TASK))
    torch.manual_seed(0)
    problems = ArithmeticTask(**TASK).train_problems()[:6]
    groups = HFRolloutEngine().generate(policy, problems, policy.spec.sampling, step=0)
    rollouts = [r for g in groups for r in g]
    # scripted advantages: two zero-advantage groups, the rest mixed signs
    adv = torch.tensor([0.0] * 8 + [1.0, -1.0, 0.5, -0.5] * 4)
    return policy, collate(rollouts, adv, policy.tokenizer.pad_token_id)


def _grads(policy, batch, **cfg):
    """Gradients of the first mini-batch (the optimizer step is captured, not taken)."""
    captured = []
    params = [p for p in policy.parameters() if p.requires_grad]

    def capture():
        if not captured:
            captured.append([p.grad.detach().clone() for p in params])

    def zero():
        for p in params:
            p.grad = None

    plan = TrainingPlan(batch.select(list(range(len(batch)))), split_rows(len(batch), 2))
    update_policy(policy, plan, GRPOConfig(**cfg), backward=lambda loss: loss.backward(), step_optimizer=capture,
                  zero_grad=zero)
    return captured[0]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_give_identical_gradients(policy_and_batch, agg):
    policy, batch = policy_and_batch
    whole = _grads(policy, batch, agg=agg, micro_batch_size=0, old_logp="rollout")
    micro = _grads(policy, batch, agg=agg, micro_batch_size=3, old_logp="rollout")
    assert any(g.abs().sum() > 0 for g in whole)
    for a, b in zip(whole, micro):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_zero_advantage_skip_gives_identical_gradients(policy_and_batch):
    policy, batch = policy_and_batch
    skipped = _grads(policy, batch, skip_zero_advantage=True, old_logp="rollout")
    full = _grads(policy, batch, skip_zero_advantage=False, old_logp="rollout")
    for a, b in zip(skipped, full):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_recomputed_old_logp_matches_the_rollout_trace(policy_and_batch):
    """The sampler's log-probs (top_k off, tempered) equal the trainer's recomputation."""
    policy, batch = policy_and_batch
    with torch.no_grad():
        logp, _ = policy.response_logp(batch.input_ids, batch.attention_mask, batch.response_width, 1.0)
    torch.testing.assert_close(logp * batch.response_mask, batch.old_logp, rtol=0, atol=2e-5)


def test_recompute_keeps_peer_traces_and_refreshes_own_rows(policy_and_batch):
    """Under ``old_logp: recompute`` own rows get the trainer's log-probs; a peer row keeps the old log-probs its
    regime set unless it is marked ``needs_old_logp``."""
    policy, batch = policy_and_batch
    b = batch.select(list(range(len(batch))))
    b.advantages = torch.ones(len(b))  # nothing skipped
    b.old_logp = torch.full_like(b.old_logp, -7.0) * b.response_mask
    b.is_peer[:4] = True  # rows 0-1: peer with a trace set by the regime; rows 2-3: peer needing recompute
    b.needs_old_logp[2:4] = True
    plan = TrainingPlan(b, [list(range(len(b)))])
    update_policy(policy, plan, GRPOConfig(old_logp="recompute"), backward=lambda loss: None,
                  step_optimizer=lambda: None, zero_grad=lambda: None)
    assert bool((b.old_logp[:2] == -7.0 * b.response_mask[:2]).all())
    with torch.no_grad():
        fresh, _ = policy.response_logp(b.input_ids, b.attention_mask, b.response_width, 1.0)
    torch.testing.assert_close(b.old_logp[2:], fresh[2:] * b.response_mask[2:], rtol=0, atol=1e-5)
