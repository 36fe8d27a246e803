"""Dropout is off for RL forwards by default (PolicySpec.disable_dropout), so train-mode log-probs are deterministic
and recomputed old log-probs equal the rollout's; disable_dropout=False keeps the checkpoint's dropout."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from mutual_rl.model.dropout import disable_dropout
from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import LoraSpec, PolicySpec, SamplingSpec
from mutual_rl.presets.tokenizers import TOKENIZER_BUILDERS
from mutual_rl.rollout.hf import HFRolloutEngine
from mutual_rl.types import Problem, collate
from mutual_rl.update.loop import recompute_old_logp

PROBLEMS = [Problem(1, "3+4=", "7", "add"), Problem(2, "12+34=", "46", "add")]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny GPT-2 saved with GPT-2's own dropout (0.1 on residuals, embeddings and attention)."""
    path = tmp_path_factory.mktemp("gpt2_dropout")
    tok = TOKENIZER_BUILDERS["bpe"]()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=len(tok), n_positions=64, n_embd=64, n_layer=2, n_head=2, resid_pdrop=0.1, embd_pdrop=0.1,
        attn_pdrop=0.1, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    ))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def rollout_batch(policy):
    torch.manual_seed(0)
    groups = HFRolloutEngine().generate(policy, PROBLEMS, SamplingSpec(n=4, max_new_tokens=5), step=0)
    rollouts = [r for g in groups for r in g]
    return collate(rollouts, torch.zeros(len(rollouts)), policy.tokenizer.pad_token_id)


def train_mode_logp(policy, b):
    policy.model.train()
    with torch.no_grad():
        return policy.response_logp(b.input_ids, b.attention_mask, b.response_width, 1.0)[0] * b.response_mask


def test_dropout_is_off_by_default(checkpoint):
    policy = build_policy(PolicySpec(name="d", model=checkpoint))
    assert policy.model.config.resid_pdrop == policy.model.config.attn_pdrop == 0.0
    assert all(m.p == 0.0 for m in policy.model.modules() if isinstance(m, torch.nn.Dropout))
    b = rollout_batch(policy)
    assert policy.model.training  # the engine restores train mode; RL forwards run in it
    first, second = train_mode_logp(policy, b), train_mode_logp(policy, b)
    assert torch.equal(first, second)
    rollout_logp = b.old_logp.clone()
    recompute_old_logp(policy, b, list(range(len(b))), 1.0, micro=0)
    torch.testing.assert_close(b.old_logp, rollout_logp, rtol=0, atol=1e-5)


def test_disable_dropout_false_keeps_the_checkpoints_dropout(checkpoint):
    policy = build_policy(PolicySpec(name="d", model=checkpoint, disable_dropout=False))
    assert policy.model.config.resid_pdrop == 0.1
    b = rollout_batch(policy)
    torch.manual_seed(1)
    first, second = train_mode_logp(policy, b), train_mode_logp(policy, b)
    assert (first - second).abs().max().item() > 1e-2
    rollout_logp = b.old_logp.clone()
    recompute_old_logp(policy, b, list(range(len(b))), 1.0, micro=0)
    assert (b.old_logp - rollout_logp).abs().max().item() > 1e-2


def test_lora_dropout_stays_as_configured(checkpoint):
    policy = build_policy(PolicySpec(name="d", model=checkpoint, lora=LoraSpec(r=4, alpha=8, dropout=0.2)))
    lora_p = {m.p for name, m in policy.model.named_modules() if "lora_dropout" in name
              and isinstance(m, torch.nn.Dropout)}
    assert lora_p == {0.2}
    base_p = {m.p for name, m in policy.model.named_modules() if "lora_dropout" not in name
              and isinstance(m, torch.nn.Dropout)}
    assert base_p == {0.0}


def test_float_attention_dropout_of_llama_is_zeroed():
    """Llama's attention reads its own float ``attention_dropout`` (copied from the config at construction)."""
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, attention_dropout=0.3, bos_token_id=0, eos_token_id=1, pad_token_id=2,
    ))
    disable_dropout(model)
    assert model.config.attention_dropout == 0.0
    assert [m.attention_dropout for m in model.modules() if hasattr(m, "attention_dropout")] == [0.0]
    model.train()
    ids = torch.tensor([[0, 5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)


def test_export_keeps_the_checkpoints_dropout_settings(checkpoint, tmp_path):
    """Training runs without dropout, but the exported config carries the checkpoint's own values (0.1), so a
    later fine-tune of the export gets the dropout it was trained with originally."""
    import json

    policy = build_policy(PolicySpec(name="d", model=checkpoint))
    policy.export(tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["resid_pdrop"] == saved["attn_pdrop"] == saved["embd_pdrop"] == 0.1
    assert policy.model.config.resid_pdrop == 0.0  # and training goes on without dropout
