"""The policy's chunked-head log-probs (hidden states out of the model, the head applied in chunks) equal the
full-logits path: values, entropies and every parameter's gradient, with and without LoRA, shared prompts and the
KL reference; and the chunked path is only taken where it is exact."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.lm_head import plain_head
from mutual_rl.model.policy import build_policy
from mutual_rl.rollout.hf import HFRolloutEngine
from mutual_rl.types import collate
from tests.model.test_shared_prompts import PROBLEMS, logp_entropy_and_grads
from tests.module.helpers import TASK, spec


def _batch(policy):
    torch.manual_seed(0)
    groups = HFRolloutEngine().generate(policy, PROBLEMS, policy.spec.sampling, step=0)
    rows = [r for g in groups for r in g]
    return collate(rows, torch.zeros(len(rows)), policy.tokenizer.pad_token_id)


@pytest.mark.parametrize("name", ["tiny:gpt2-bpe", "tiny:llama-char"])
@pytest.mark.parametrize("lora, share, reference", [(False, True, False), (True, True, True), (False, False, True),
                                                    (True, False, False)])
def test_chunked_head_matches_full_logits(name, lora, share, reference, monkeypatch):
    policy = build_policy(spec("p", name, lora=lora), task=ArithmeticTask(**TASK), needs_reference=reference)
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:  # non-trivial adapters, so the reference (adapters off) differs
                p.normal_(0, 0.05)
    head = plain_head(policy.model)
    assert head is not None
    policy.share_prompts = share
    b = _batch(policy)
    monkeypatch.setattr("mutual_rl.algorithms.token_logp.DEFAULT_CHUNK_ELEMENTS", 7 * 300)  # several chunks
    results = []
    for chunked in (False, True):
        policy.chunked_head = chunked
        logp, ent, grads = logp_entropy_and_grads(policy, b, 0.9)
        ref = None
        if reference:
            with torch.no_grad():
                ref = policy.response_logp(b.input_ids, b.attention_mask, b.response_width, 0.9, reference=True)[0]
            ref = ref * b.response_mask
        results.append((logp, ent, grads, ref))
    (l0, e0, g0, r0), (l1, e1, g1, r1) = results
    torch.testing.assert_close(l1, l0, rtol=0, atol=1e-5)
    torch.testing.assert_close(e1, e0, rtol=0, atol=1e-5)
    assert g0.keys() == g1.keys() and g0
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-4, atol=1e-6, msg=n)
    if reference:
        torch.testing.assert_close(r1, r0, rtol=0, atol=1e-5)
    if reference and lora:
        assert (r1 - l1).abs().max() > 1e-4  # adapters off: the reference is really another model
    assert plain_head(policy.model) is head  # the head is put back

def test_chunked_head_declined_where_not_exact(monkeypatch):
    policy = build_policy(spec("p", "tiny:gpt2-bpe"), task=ArithmeticTask(**TASK))
    assert plain_head(policy.model) is policy.model.lm_head
    monkeypatch.setattr(policy.model.config, "model_type", "gemma2")  # soft-capped logits after the head
    assert plain_head(policy.model) is None
    monkeypatch.undo()
    policy.model.lm_head = nn.Sequential(policy.model.lm_head)  # not a plain Linear head
    assert plain_head(policy.model) is None


def test_the_policy_path_runs_in_chunks(monkeypatch):
    """The chunk budget is read per call: at 300 logits per chunk a 306-token vocabulary runs one token at a time."""
    import mutual_rl.algorithms.token_logp as T

    policy = build_policy(spec("p", "tiny:gpt2-bpe"), task=ArithmeticTask(**TASK))
    b = _batch(policy)
    calls = []
    real = T._chunk_logits
    monkeypatch.setattr(T, "_chunk_logits", lambda h, *a: calls.append(h.shape[0]) or real(h, *a))
    monkeypatch.setattr(T, "DEFAULT_CHUNK_ELEMENTS", 300)
    policy.response_logp(b.input_ids, b.attention_mask, b.response_width, 1.0)[0].sum().backward()
    n = b.input_ids.shape[0] * b.response_width
    assert calls == [1] * (2 * n)  # forward and backward, one row each
