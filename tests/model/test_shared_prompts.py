"""The shared-prompt forward (one prompt pass per group, gathered KV cache) equals the plain forward."""

from __future__ import annotations

import pytest
import torch

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.policy import build_policy
from mutual_rl.rollout.hf import HFRolloutEngine
from mutual_rl.types import Problem, collate
from tests.module.helpers import TASK, spec

PROBLEMS = [Problem(1, "3+4=", "7", "add"), Problem(2, "12+34=", "46", "add"), Problem(3, "99-9=", "90", "sub")]


@pytest.mark.parametrize("name", ["tiny:gpt2-bpe", "tiny:llama-char"])
@pytest.mark.parametrize("lora", [False, True])
def test_shared_prompt_forward_matches_plain(name, lora):
    policy = build_policy(spec("p", name, lora=lora), task=ArithmeticTask(**TASK))
    if lora:  # make the adapters non-trivial
        with torch.no_grad():
            for n, p in policy.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.05)
    torch.manual_seed(0)
    groups = HFRolloutEngine().generate(policy, PROBLEMS, policy.spec.sampling, step=0)
    rows = [r for g in groups for r in g]
    b = collate(rows, torch.zeros(len(rows)), policy.tokenizer.pad_token_id)
    results = []
    for share in (False, True):
        policy.share_prompts = share
        results.append(logp_entropy_and_grads(policy, b, 0.9))
    policy.share_prompts = True
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=1e-5)
    assert results[0][2].keys() == results[1][2].keys()
    for n, g0 in results[0][2].items():
        torch.testing.assert_close(g0, results[1][2][n], rtol=1e-4, atol=1e-6, msg=n)


def logp_entropy_and_grads(policy, b, temperature: float):
    """(masked log-probs, masked entropies, {parameter name: gradient of -Σ logp}) of batch ``b``."""
    policy.zero_grad(set_to_none=True)
    logp, ent = policy.response_logp(b.input_ids, b.attention_mask, b.response_width, temperature, with_entropy=True)
    (-(logp * b.response_mask).sum()).backward()
    grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad}
    return logp.detach() * b.response_mask, ent * b.response_mask, grads
