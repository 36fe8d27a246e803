"""Sampled log-probs recorded one step at a time (SampledLogProbs) equal the reference that keeps generate's
output_scores for the whole response: same tokens, same log-probs, for both architectures, LoRA, top-k / top-p and
temperature, with rows stopping at different steps."""

from __future__ import annotations

import pytest
import torch

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import SamplingSpec
from mutual_rl.rollout.hf import SampledLogProbs
from tests.module.helpers import TASK, spec
from tests.rollout.helpers import assert_same_rollouts, sampled


@pytest.mark.parametrize("name, lora", [("tiny:gpt2-bpe", True), ("tiny:llama-char", False)])
@pytest.mark.parametrize("top_k, top_p, temperature", [(0, 1.0, 1.0), (5, 0.9, 0.7)])
def test_streamed_logprobs_equal_output_scores(name, lora, top_k, top_p, temperature):
    policy = build_policy(spec("p", name, lora=lora), task=ArithmeticTask(**TASK))
    sampling = SamplingSpec(n=4, max_new_tokens=8, temperature=temperature, top_p=top_p, top_k=top_k)
    # both on generate: the static loop (the CPU default) records no scores; it is checked against generate in
    # test_static_decode.py
    runs = [sampled(policy, sampling, 5, _keep_scores=keep, sampler="generate") for keep in (True, False)]
    assert len({len(r.response_ids) for r in runs[0]}) > 1
    assert_same_rollouts(*runs, atol=0)
    for b in runs[1]:
        assert bool((b.logp <= 0).all()) and bool(torch.isfinite(b.logp).all())


def test_recorder_pairs_each_step_with_its_tokens():
    rec = SampledLogProbs()
    rec.put(torch.tensor([[7, 7, 7]]).T)  # the prompt: ignored
    for step_scores, tokens in [(torch.tensor([[0.0, 1.0], [2.0, 0.0]]), torch.tensor([1, 0])),
                                (torch.tensor([[1.0, 1.0], [0.0, 0.0]]), torch.tensor([0, 1]))]:
        assert torch.equal(rec(None, step_scores), step_scores)  # no warpers: the scores pass through unchanged
        rec.put(tokens)
    e = torch.exp(torch.tensor(1.0))
    half = torch.log(torch.tensor(0.5))
    expected = torch.stack([torch.stack([1 - torch.log(1 + e), half]), torch.stack([2 - torch.log(1 + e ** 2), half])])
    torch.testing.assert_close(rec.logp(2), expected)
    with pytest.raises(RuntimeError, match="3 tokens per row but 2 were streamed"):
        rec.logp(3)
