"""PolicySpec.compile: the training forwards through torch.compile give the eager values, entropies and gradients
(shared prompts, chunked head, LoRA), reuse the compiled code for new batch and response sizes, add nothing to the
module tree, and fail clearly without a C++ compiler (FSDP refuses compiled policies: tests/distributed/test_fsdp_config.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.compiled import training_model
from mutual_rl.model.policy import build_policy
from mutual_rl.rollout.hf import HFRolloutEngine
from mutual_rl.types import Problem, collate
from tests.model.test_shared_prompts import PROBLEMS, logp_entropy_and_grads
from tests.module.helpers import TASK, spec

MORE = [Problem(4, "5+5=", "10", "add"), Problem(5, "70-13=", "57", "sub")]


def _batch(policy, problems, max_new_tokens):
    torch.manual_seed(0)
    sampling = dataclasses.replace(policy.spec.sampling, max_new_tokens=max_new_tokens)
    rows = [r for g in HFRolloutEngine().generate(policy, problems, sampling, step=0) for r in g]
    return collate(rows, torch.zeros(len(rows)), policy.tokenizer.pad_token_id)


# the shared-prompt forward is two compiled graphs; LoRA is tested on the plain forward (one) to keep CI short
@pytest.mark.slow
@pytest.mark.parametrize("name, lora, share", [("tiny:gpt2-bpe", False, True), ("tiny:gpt2-bpe", True, False)])
def test_compiled_forward_matches_eager(name, lora, share):
    policy = build_policy(dataclasses.replace(spec("p", name, lora=lora), compile=True), task=ArithmeticTask(**TASK))
    policy.share_prompts = share
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:  # non-trivial adapters
                p.normal_(0, 0.05)
    names = [n for n, _ in policy.named_parameters()]
    batches = [_batch(policy, PROBLEMS, 5), _batch(policy, PROBLEMS[:2] + MORE, 7)]  # other rows and widths
    assert batches[0].input_ids.shape != batches[1].input_ids.shape
    for k, b in enumerate(batches):
        policy.spec = dataclasses.replace(policy.spec, compile=False)
        l0, e0, g0 = logp_entropy_and_grads(policy, b, 0.9)
        policy.spec = dataclasses.replace(policy.spec, compile=True)
        # the second batch's sizes reuse the first batch's compiled code (symbolic shapes): a recompile is an error
        with torch._dynamo.config.patch(error_on_recompile=k > 0):
            l1, e1, g1 = logp_entropy_and_grads(policy, b, 0.9)
        torch.testing.assert_close(l1, l0, rtol=0, atol=1e-5)
        torch.testing.assert_close(e1, e0, rtol=0, atol=1e-5)
        assert g0.keys() == g1.keys() and g0
        for n in g0:  # float rounding of reordered sums: ~5e-7 of a gradient's largest entry
            scale = float(g0[n].abs().max())
            torch.testing.assert_close(g1[n], g0[n], rtol=1e-4, atol=max(1e-6 * scale, 1e-7), msg=n)
    built = policy.__dict__.get("_compiled")  # built by the policy's own forward, not by this test
    assert built is not None and built[0] is policy.model
    compiled = training_model(policy, policy.model)
    assert compiled is built[1] and type(compiled).__name__ == "OptimizedModule"
    assert training_model(policy, policy.model) is compiled  # built once
    assert [n for n, _ in policy.named_parameters()] == names  # not a submodule: nothing added
    assert not any("_orig_mod" in k for k in policy.state_dict())


def test_compile_refused_without_a_compiler(monkeypatch):
    policy = build_policy(spec("p", "tiny:gpt2-bpe"), task=ArithmeticTask(**TASK))
    assert training_model(policy, policy.model) is policy.model  # compile off: the model itself
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(ValueError, match="needs a C\\+\\+ compiler"):
        build_policy(dataclasses.replace(spec("p", "tiny:gpt2-bpe"), compile=True), task=ArithmeticTask(**TASK))


def test_only_the_trained_models_forwards_are_routed(monkeypatch):
    """The update's forward goes through training_model; the KL reference (under LoRA: the same model with its
    adapters off) never does."""
    policy = build_policy(dataclasses.replace(spec("p", "tiny:gpt2-bpe", lora=True), compile=True),
                          task=ArithmeticTask(**TASK), needs_reference=True)
    calls = []

    def record(pol, model):
        calls.append(model)
        return model  # eager: only the routing is under test

    monkeypatch.setattr("mutual_rl.model.policy.training_model", record)
    b = _batch(policy, PROBLEMS, 5)
    policy.response_logp(b.input_ids, b.attention_mask, b.response_width, 1.0)
    assert calls and all(m is policy.model for m in calls)
    calls.clear()
    with torch.no_grad():
        policy.response_logp(b.input_ids, b.attention_mask, b.response_width, 1.0, reference=True)
    assert calls == []
