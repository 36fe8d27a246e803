"""One-query CPU decoding attention (rollout/decode_attention.py) equals transformers' sdpa: the function on its own
(grouped-query heads, boolean / float / no masks, a cache that is a slice of a longer buffer), the cases it hands
to sdpa unchanged, and whole rollouts of both architectures: same tokens, same log-probs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import mutual_rl.rollout.decode_attention as da
from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import SamplingSpec
from tests.model.test_shared_prompts import PROBLEMS
from tests.module.helpers import TASK, spec
from tests.rollout.helpers import assert_same_rollouts, sampled


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


def test_fully_masked_row_gives_zeros_as_sdpa():
    query, key, value = _inputs(hkv=2)
    mask = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    mask[1] = False  # e.g. a one-token prefill of a fully padded row
    module = _module(4, 2)
    ours = da.one_query_attention(module, query, key, value, mask)[0]
    ref = sdpa_attention_forward(module, query, key, value, mask)[0]
    assert torch.equal(ours[1], torch.zeros_like(ours[1])) and torch.isfinite(ours).all()
    torch.testing.assert_close(ours, ref, rtol=0, atol=2e-6)


def test_the_switch_is_the_registered_function_only_and_comes_back():
    """Inside, transformers' "sdpa" function is ours, the model's configuration is untouched (still "sdpa"), and
    the previous function is back after an error; models on another implementation, or enabled=False, get no
    switch; a nested use keeps the outer one."""
    policy = build_policy(spec("p", "tiny:gpt2-bpe", lora=True), task=ArithmeticTask(**TASK))
    config = policy.model.get_base_model().config
    before = ALL_ATTENTION_FUNCTIONS["sdpa"]
    assert before is not da.one_query_attention
    with pytest.raises(RuntimeError, match="inside"):
        with da.decode_attention(policy.model):  # a peft wrapper
            assert ALL_ATTENTION_FUNCTIONS["sdpa"] is da.one_query_attention
            assert config._attn_implementation == "sdpa"
            with da.decode_attention(policy.model):
                assert ALL_ATTENTION_FUNCTIONS["sdpa"] is da.one_query_attention
            assert ALL_ATTENTION_FUNCTIONS["sdpa"] is da.one_query_attention and da._delegate[-1] is before
            raise RuntimeError("inside")
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is before and da._delegate == [sdpa_attention_forward]
    with da.decode_attention(policy.model, enabled=False):
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is before
    config._attn_implementation = "eager"
    try:
        with da.decode_attention(policy.model):
            assert ALL_ATTENTION_FUNCTIONS["sdpa"] is before
    finally:
        config._attn_implementation = "sdpa"


def test_models_that_branch_on_the_implementation_name_compute_the_same():
    """Falcon checks ``_attn_implementation == "sdpa"`` and calls torch's kernel itself: inside the switch its
    logits (prompt and one-token steps) are those outside, bit for bit."""
    from transformers import FalconConfig, FalconForCausalLM

    torch.manual_seed(0)
    model = FalconForCausalLM(FalconConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           alibi=False, new_decoder_architecture=False, attn_implementation="sdpa"))
    model.eval()
    ids = torch.tensor([[0, 5, 6, 7], [3, 4, 5, 6]])
    attn = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    runs = []
    for inside in (False, True):
        with torch.no_grad(), da.decode_attention(model, enabled=inside):
            torch.manual_seed(1)
            out = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, max_new_tokens=5, top_k=0,
                                 output_scores=True, return_dict_in_generate=True, pad_token_id=0)
        runs.append(out)
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    for a, b in zip(runs[0].scores, runs[1].scores):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name, lora", [("tiny:gpt2-bpe", True), ("tiny:llama-char", False)])
def test_rollouts_equal_sdpa_rollouts(name, lora, monkeypatch):
    """Same seed, prompts of different lengths (left padding), rows stopping at different steps: the fast path
    samples the same tokens with the same log-probs as sdpa, and it did run for every decoding step's layers."""
    policy = build_policy(spec("p", name, lora=lora), task=ArithmeticTask(**TASK))
    sampling = SamplingSpec(n=4, max_new_tokens=12, temperature=1.0, top_p=1.0, top_k=0)
    hits = []
    applies = da._applies
    monkeypatch.setattr(da, "_applies", lambda *a: hits.append(applies(*a)) or hits[-1])
    runs = [sampled(policy, sampling, 11, decode_attention=False)]
    assert not hits  # sdpa throughout: the function was never called
    runs.append(sampled(policy, sampling, 11))
    assert len({len(policy.encode_prompt(policy.render_prompt(x.problem))) for x in PROBLEMS}) > 1
    assert len({len(r.response_ids) for r in runs[0]}) > 1
    layers = policy.model.config.num_hidden_layers
    steps = max(len(r.response_ids) for r in runs[1])
    # the shared prompt prefill (several query tokens) goes to sdpa; every one-token step (the prompt's last token,
    # then each sampled token but the last) takes the fast path
    assert hits.count(True) == layers * steps and hits.count(False) == layers
    assert_same_rollouts(*runs, atol=1e-5)
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa_attention_forward  # restored
