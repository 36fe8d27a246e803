"""Weights that are finite but huge (a learning rate far too high): the non-finite weight guard passes them, and
sampling used to end in torch's ``probability tensor contains either inf, nan or element < 0``. Now one error
names the policy and its learning rate."""

from __future__ import annotations

import torch

from mutual_rl.model.policy import build_policy
from mutual_rl.rollout import HFRolloutEngine, NonFiniteLogitsError
from mutual_rl.types import Problem
from tests.module.helpers import spec
from tests.reliability import one_glance


def test_huge_finite_weights_are_one_error_naming_the_policy_and_its_lr():
    policy = build_policy(spec("big", "tiny:gpt2-bpe", lr=3.0))
    with torch.no_grad():
        for p in policy.model.parameters():
            p.mul_(1e20)
    assert all(torch.isfinite(p).all() for p in policy.model.parameters())  # the weights are finite
    with one_glance.raises(NonFiniteLogitsError, match=r"policy 'big': its logits are inf/NaN while sampling, although "
                                                   r"every weight is finite.*optimizer\.lr = 3 for this policy") as e:
        HFRolloutEngine().generate(policy, [Problem(1, "3+4=", "7", "add")], policy.spec.sampling, step=0)
    assert "probability tensor contains" in str(e.value.__cause__)
