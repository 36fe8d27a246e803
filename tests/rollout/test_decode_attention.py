"""One-query CPU decoding attention (rollout/decode_attention.py) equals transformers' sdpa: the function on its own
(grouped-query heads, boolean / float / no masks, a cache that is a slice of a longer buffer), the cases it hands
to sdpa unchanged, and whole rollouts of both architectures: same tokens, same log-probs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import mutual_rl.rollout.decode_attention as da
from mutual_rl.data.task import ArithmeticTask
from mutual_rl.policies.policy import build_policy
from mutual_rl.policies.spec import SamplingSpec
from mutual_rl.rollout.hf import HFRolloutEngine
from tests.trainer.helpers import TASK, spec
from tests.trainer.test_shared_prompts import PROBLEMS


def _inputs(b=3, h=4, hkv=2, length=7, d=8, q=1, buffer=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(b, h, q, d, generator=g)
    kbuf, vbuf = torch.randn(b, hkv, buffer, d, generator=g), torch.randn(b, hkv, buffer, d, generator=g)
    return query, kbuf[:, :, :length], vbuf[:, :, :length]  # the cache: a slice of a longer buffer


def _module(h, hkv):
    return SimpleNamespace(num_key_value_groups=h // hkv, is_causal=True, training=False)


@pytest.mark.parametrize("hkv", [4, 2, 1])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
@pytest.mark.parametrize("scaling", [None, 0.3])
def test_one_query_attention_equals_sdpa(hkv, mask_kind, scaling):
    query, key, value = _inputs(hkv=hkv)
    mask = None
    if mask_kind != "none":
        keep = torch.ones(3, 1, 1, 7, dtype=torch.bool)
        keep[0, ..., :3] = False  # left padding of two rows
        keep[2, ..., :1] = False
        mask = keep if mask_kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    module = _module(4, hkv)
    assert da._applies(query, key, value, mask, 0.0, {})
    ours, none = da.one_query_attention(module, query, key, value, mask, scaling=scaling)
    ref, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=scaling)
    assert none is None and ours.shape == ref.shape == (3, 1, 4, 8)
    torch.testing.assert_close(ours, ref, rtol=0, atol=2e-6)
    if mask_kind == "bool":  # a masked position has no influence: change it, same output
        key2 = key.clone()
        key2[0, :, 0] += 100.0
        torch.testing.assert_close(da.one_query_attention(module, query, key2, value, mask)[0],
                                   da.one_query_attention(module, query, key, value, mask)[0], rtol=0, atol=0)


@pytest.mark.parametrize("case", ["prompt", "grad", "bf16", "dropout", "mask_heads"])
def test_other_cases_go_to_sdpa_unchanged(case):
    query, key, value = _inputs(q=5 if case == "prompt" else 1)
    mask, dropout = None, 0.0
    if case == "grad":
        query.requires_grad_(True)
    if case == "bf16":
        query, key, value = query.bfloat16(), key.bfloat16(), value.bfloat16()
    if case == "dropout":
        dropout = 0.1
    if case == "mask_heads":  # a per-head mask is not the shape decoding uses
        mask = torch.ones(3, 4, 1, 7, dtype=torch.bool)
    assert not da._applies(query, key, value, mask, dropout, {})
    module = _module(4, 2)
    torch.manual_seed(0)
    ours, _ = da.one_query_attention(module, query, key, value, mask, dropout=dropout)
    torch.manual_seed(0)
    ref, _ = sdpa_attention_forward(module, query, key, value, mask, dropout=dropout)
    assert torch.equal(ours, ref)


def test_only_sdpa_models_on_the_cpu_switch_and_the_implementation_comes_back():
    policy = build_policy(spec("p", "tiny:gpt2-bpe"), task=ArithmeticTask(**TASK))
    config = policy.model.config
    assert config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="inside"):
        with da.decode_attention(policy.model):
            assert config._attn_implementation == da.NAME
            raise RuntimeError("inside")
    assert config._attn_implementation == "sdpa"
    with da.decode_attention(policy.model, enabled=False):
        assert config._attn_implementation == "sdpa"
    config._attn_implementation = "eager"
    try:
        with da.decode_attention(policy.model):
            assert config._attn_implementation == "eager"
    finally:
        config._attn_implementation = "sdpa"


@pytest.mark.parametrize("name, lora", [("tiny:gpt2-bpe", True), ("tiny:llama-char", False)])
def test_rollouts_equal_sdpa_rollouts(name, lora, monkeypatch):
    """Same seed, prompts of different lengths (left padding), rows stopping at different steps: the fast path
    samples the same tokens with the same log-probs as sdpa, and it did run for every decoding step's layers."""
    policy = build_policy(spec("p", name, lora=lora), task=ArithmeticTask(**TASK))
    sampling = SamplingSpec(n=4, max_new_tokens=12, temperature=1.0, top_p=1.0, top_k=0)
    hits = []
    applies = da._applies
    monkeypatch.setattr(da, "_applies", lambda *a: hits.append(applies(*a)) or hits[-1])
    runs = []
    for fast in (False, True):
        engine = HFRolloutEngine()
        engine.decode_attention = fast
        torch.manual_seed(11)
        runs.append([r for g in engine.generate(policy, PROBLEMS, sampling, step=0) for r in g])
        if not fast:
            assert not hits  # sdpa throughout: the function was never called
    assert len({len(p.encode_prompt(x.problem)) for p in [policy] for x in PROBLEMS}) > 1
    assert len({len(r.response_ids) for r in runs[0]}) > 1
    layers = policy.model.config.num_hidden_layers
    steps = max(len(r.response_ids) for r in runs[1])
    # the shared prompt prefill (several query tokens) goes to sdpa; every one-token step (the prompt's last token,
    # then each sampled token but the last) takes the fast path
    assert hits.count(True) == layers * steps and hits.count(False) == layers
    for a, b in zip(*runs):
        assert torch.equal(a.response_ids, b.response_ids)
        torch.testing.assert_close(b.logp, a.logp, rtol=0, atol=1e-5)
    assert policy.model.config._attn_implementation == "sdpa"
