"""Rows that share a prompt prefill it once (rollout/hf.py shared_prompt_cache): the same tokens and log-probs as
every row prefilling its own prompt, for both architectures with prompts of different lengths (left padding), with
LoRA and top-k / top-p; the prefill runs over the distinct prompts only; no sharing where nothing is shared."""

from __future__ import annotations

import pytest
import torch

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import SamplingSpec
from mutual_rl.rollout.hf import HFRolloutEngine, shared_prompt_cache
from tests.model.test_shared_prompts import PROBLEMS
from tests.module.helpers import TASK, spec
from tests.rollout.helpers import assert_same_rollouts, sampled


def _embedding_batches(policy):
    """Records the [batch, tokens] of every forward of the policy's model (a hook on its input embedding)."""
    seen = []
    emb = policy.model.get_input_embeddings()
    return seen, emb.register_forward_hook(lambda mod, args, out: seen.append(tuple(args[0].shape)))


@pytest.mark.parametrize("name, lora, top_k, top_p", [("tiny:gpt2-bpe", True, 0, 1.0), ("tiny:llama-char", False, 5, 0.9)])
def test_shared_prefill_equals_per_row_prefill(name, lora, top_k, top_p):
    policy = build_policy(spec("p", name, lora=lora), task=ArithmeticTask(**TASK))
    sampling = SamplingSpec(n=4, max_new_tokens=10, temperature=0.8, top_p=top_p, top_k=top_k)
    widths = {len(policy.encode_prompt(policy.render_prompt(p.problem))) for p in PROBLEMS}
    assert len(widths) > 1  # left padding in the batch
    runs, shapes = [], []
    for share in (False, True):
        seen, hook = _embedding_batches(policy)
        try:
            runs.append(sampled(policy, sampling, 7, share_prefill=share))
        finally:
            hook.remove()
        shapes.append(seen)
    rows, width = len(PROBLEMS) * sampling.n, max(widths)
    assert shapes[0][0] == (rows, width)  # generate's own prefill of every row
    assert shapes[1][0] == (len(PROBLEMS), width - 1) and shapes[1][1] == (rows, 1)  # distinct prompts, then last token
    assert len({len(r.response_ids) for r in runs[0]}) > 1
    assert_same_rollouts(*runs, atol=1e-5)


def test_nothing_shared_means_no_cache():
    policy = build_policy(spec("p", "tiny:gpt2-bpe"), task=ArithmeticTask(**TASK))
    ids = torch.tensor([[5, 6, 7], [5, 6, 8], [0, 6, 7]])
    attn = torch.tensor([[1, 1, 1], [1, 1, 1], [0, 1, 1]])
    with torch.no_grad():
        assert shared_prompt_cache(policy.model, ids, attn) is None  # all rows distinct
        assert shared_prompt_cache(policy.model, ids[:, -1:], attn[:, -1:]) is None  # one-token prompts
        cache = shared_prompt_cache(policy.model, ids[[0, 0, 2]], attn[[0, 0, 2]])
    assert cache is not None and cache.get_seq_length() == 2
    k = cache.layers[0].keys
    assert k.shape[0] == 3 and torch.equal(k[0], k[1]) and not torch.equal(k[0], k[2])


def test_two_token_prompts_with_a_fully_padded_row():
    """The widest prompt is two tokens: the shared prefill is a one-token query in which a one-token prompt's row is
    all padding; sampling still matches per-row prefill (and nothing turns NaN)."""
    policy = build_policy(spec("p", "tiny:gpt2-bpe"), task=ArithmeticTask(**TASK))
    engine = HFRolloutEngine()
    sampling = SamplingSpec(n=2, max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=0)
    runs = []
    for share in (False, True):
        engine.share_prefill = share
        torch.manual_seed(3)
        with torch.no_grad():
            runs.append(engine._sample(policy, [[5], [5, 6], [5, 6]], sampling))
    for (ids_a, lp_a), (ids_b, lp_b) in zip(*[zip(*r) for r in runs]):
        assert torch.equal(ids_a, ids_b)
        torch.testing.assert_close(lp_b, lp_a, rtol=0, atol=1e-5)


def test_only_plain_key_value_caches_are_gathered():
    """Linear-attention / hybrid cache layers keep states batch_select_indices does not gather: no sharing."""
    from transformers import DynamicCache, Qwen3NextConfig

    from mutual_rl.rollout.hf import _rows_gatherable

    assert not _rows_gatherable(DynamicCache(config=Qwen3NextConfig(num_hidden_layers=4)))
    assert not _rows_gatherable(None)
    policy = build_policy(spec("p", "tiny:llama-char"), task=ArithmeticTask(**TASK))
    ids = torch.tensor([[5, 6, 7], [5, 6, 7]])
    with torch.no_grad():
        cache = shared_prompt_cache(policy.model, ids, torch.ones_like(ids))
    assert _rows_gatherable(cache) and cache.get_seq_length() == 2
