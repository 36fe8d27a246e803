"""The preallocated key/value cache changes nothing that generation samples: the same tokens and log-probs as
Hugging Face's default cache under the same seed (left-padded prompts of different lengths, EOS mid-way, top-k /
top-p, LoRA); buffers grow past a too-small capacity; cache surgery keeps the values."""

from __future__ import annotations

import pytest
import torch

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.policies.policy import build_policy
from mutual_rl.policies.spec import SamplingSpec
from mutual_rl.rollout.hf import HFRolloutEngine
from mutual_rl.rollout.kv_cache import PreallocatedLayer, preallocated_cache
from tests.trainer.helpers import TASK, spec
from tests.trainer.test_shared_prompts import PROBLEMS


@pytest.mark.parametrize("name, lora", [("tiny:gpt2-bpe", False), ("tiny:llama-char", True)])
@pytest.mark.parametrize("top_k, top_p, temperature", [(0, 1.0, 1.0), (5, 0.9, 0.7)])
def test_preallocated_cache_samples_the_same(name, lora, top_k, top_p, temperature):
    policy = build_policy(spec("p", name, lora=lora), task=ArithmeticTask(**TASK))
    sampling = SamplingSpec(n=4, max_new_tokens=8, temperature=temperature, top_p=top_p, top_k=top_k)
    runs = []
    for pre in (False, True):
        engine = HFRolloutEngine()
        engine.preallocate_cache = pre
        torch.manual_seed(3)
        runs.append([r for g in engine.generate(policy, PROBLEMS, sampling, step=0) for r in g])
    assert len({len(r.response_ids) for r in runs[0]}) > 1  # rows stop at different steps
    for a, b in zip(*runs):
        assert torch.equal(a.response_ids, b.response_ids) and a.response_text == b.response_text
        torch.testing.assert_close(a.logp, b.logp, rtol=0, atol=0)


def test_layer_grows_and_rebuffers():
    layer = PreallocatedLayer(capacity=2)
    k = torch.arange(2 * 1 * 3 * 2, dtype=torch.float).view(2, 1, 3, 2)
    keys, _ = layer.update(k, -k)  # 3 positions into a capacity of 2: grown
    assert layer.capacity >= 3 and torch.equal(keys, k)
    step = torch.full((2, 1, 1, 2), 7.0)
    keys, values = layer.update(step, -step)
    assert torch.equal(keys, torch.cat([k, step], 2)) and torch.equal(values, -torch.cat([k, step], 2))
    assert keys.data_ptr() == layer._k.data_ptr()  # a view of the buffer, not a copy
    layer.batch_select_indices(torch.tensor([1]))
    keys, _ = layer.update(step[:1], -step[:1])
    assert torch.equal(keys, torch.cat([k[1:], step[:1], step[:1]], 2)) and layer.get_seq_length() == 5


def test_only_full_attention_layers_are_replaced():
    policy = build_policy(spec("p", "tiny:llama-char"), task=ArithmeticTask(**TASK))
    cache = preallocated_cache(policy.model, 16)
    assert cache.layers and all(isinstance(layer, PreallocatedLayer) for layer in cache.layers)
    policy.model.config.sliding_window = 4  # a sliding-window model keeps Hugging Face's own layers
    policy.model.config.layer_types = ["sliding_attention"] * policy.model.config.num_hidden_layers
    assert not any(isinstance(layer, PreallocatedLayer) for layer in preallocated_cache(policy.model, 16).layers)
