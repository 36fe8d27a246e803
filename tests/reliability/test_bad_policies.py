"""Policy inputs that cannot work fail (or warn) with messages that name the policy, the setting and the fix."""

from __future__ import annotations

import warnings

import pytest

from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import LoraSpec, PolicySpec, SamplingSpec, WarmStart
from tests.reliability import one_glance


@pytest.mark.parametrize("model", ["./no/such/dir", "../no/such/dir", "/tmp/mutual-rl-missing-xyz/model",
                                   "~/mutual-rl-missing-xyz", "tests/no-such-checkpoint"])
def test_missing_local_model_path_is_named(model):
    """Local-looking paths (prefix ``/ ./ ../ ~``, or a first part that exists here: ``tests/``) must exist; the
    message is ours, not transformers' "Repo id must be in the form ..."."""
    with one_glance.raises(FileNotFoundError) as err:
        build_policy(PolicySpec(name="alice", model=model))
    msg = str(err.value)
    assert f"policy 'alice': model {model!r} was not found" in msg
    assert "does not exist" in msg and "Fix this policy's model:" in msg
    assert "Repo id must be" not in msg


def test_missing_local_tokenizer_path_is_named(tmp_path):
    with one_glance.raises(FileNotFoundError, match=r"policy 'bob': tokenizer '\./no/tok' was not found"):
        build_policy(PolicySpec(name="bob", model=str(tmp_path), tokenizer="./no/tok"))


def test_hub_ids_are_left_to_transformers():
    """``name`` and ``org/name`` whose ``org`` is no local folder are Hub ids, passed to transformers unchanged."""
    from mutual_rl.model.loading import _checked_path

    assert _checked_path("p", "model", "no-such-org-xyz/model") == "no-such-org-xyz/model"
    assert _checked_path("p", "model", "gpt2") == "gpt2"


def test_warmstart_on_a_non_preset_model_is_an_error():
    with one_glance.raises(ValueError) as err:
        PolicySpec(name="carol", model="Qwen/Qwen3-0.6B", warmstart=WarmStart(steps=10))
    msg = str(err.value)
    assert "policy 'carol'" in msg and "warmstart is set" in msg and "'Qwen/Qwen3-0.6B' is not a tiny: preset" in msg
    assert "Remove warmstart from this policy" in msg
    PolicySpec(name="carol", model="tiny:gpt2-bpe", warmstart=WarmStart(steps=10))  # presets take it
    PolicySpec(name="carol", model="Qwen/Qwen3-0.6B")  # no warmstart: fine


def test_group_of_one_warns_that_grpo_gets_no_signal():
    with pytest.warns(UserWarning) as record:
        PolicySpec(name="dave", model="tiny:gpt2-bpe", sampling=SamplingSpec(n=1))
    (w,) = [w for w in record if "sampling.n is 1" in str(w.message)]
    msg = str(w.message)
    assert msg.startswith("policy 'dave': sampling.n is 1")
    assert "advantage is 0" in msg and "GRPO gets no signal" in msg and "Set sampling.n >= 2" in msg
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PolicySpec(name="dave", model="tiny:gpt2-bpe", sampling=SamplingSpec(n=2))


# ------------------------------------------------------------------------------------- LoRA targets that do not exist
def _lora(name: str, model: str, targets) -> PolicySpec:
    warm = WarmStart(steps=0) if model.startswith("tiny:") else None
    return PolicySpec(name=name, model=model, warmstart=warm, lora=LoraSpec(r=4, target_modules=targets))


LLAMA_LINEAR = "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"


def _tiny(arch: str):
    """A randomly initialised transformers model of one layer (the real classes peft adapts)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    if arch == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2))


def test_misspelt_lora_target_next_to_a_good_one_is_not_ignored(preset_cache):
    """peft fails only when no entry matches: 'q_prj' next to 'v_proj' was silently dropped (LoRA on v_proj only);
    the check runs in build_policy, before peft."""
    with one_glance.raises(ValueError) as err:
        build_policy(_lora("char", "tiny:llama-char", ["q_prj", "v_proj"]))
    msg = str(err.value)
    assert msg.startswith("policy 'char': lora.target_modules 'q_prj' matches no layer LoRA can adapt in "
                          "tiny:llama-char (LlamaForCausalLM)")
    assert f"Its linear layers: {LLAMA_LINEAR}." in msg


def test_lora_target_missing_from_the_model_names_the_policy_and_the_layers():
    """GPT-2 has no q_proj: peft's raw NoMatchingPeftModuleError named neither the policy nor GPT-2's layers."""
    from mutual_rl.model.policy import check_lora_targets

    with one_glance.raises(ValueError) as err:
        check_lora_targets(_tiny("gpt2"), _lora("gpt", "openai-community/gpt2", ["q_proj", "v_proj"]))
    msg = str(err.value)
    assert msg.startswith("policy 'gpt': lora.target_modules 'q_proj', 'v_proj' match no layer LoRA can adapt in "
                          "openai-community/gpt2 (GPT2LMHeadModel)")
    assert "Its linear layers: c_attn, c_fc, c_proj, lm_head." in msg and "all-linear" in msg


def test_lora_target_that_is_no_linear_layer_is_named():
    from mutual_rl.model.policy import check_lora_targets

    model = _tiny("llama")
    with one_glance.raises(ValueError) as err:
        check_lora_targets(model, _lora("p", "my/llama", ["mlp", "self_attn.q_proj"]))
    msg = str(err.value)
    assert "policy 'p': lora.target_modules 'mlp' matches no layer" in msg
    assert "('mlp' is not a linear, embedding or convolution layer)" in msg and LLAMA_LINEAR in msg
    with one_glance.raises(ValueError, match=r"policy 'p': lora.target_modules 'q_proj' matches no layer .* a string is a "
                                         r"regular expression .*'\.\*q_proj'"):
        check_lora_targets(model, _lora("p", "my/llama", "q_proj"))  # peft full-matches a string: nothing
    with one_glance.raises(ValueError, match=r"policy 'p': lora.target_modules '\(q' is not a valid regular expression"):
        check_lora_targets(model, _lora("p", "my/llama", "(q"))
    with one_glance.raises(ValueError, match=r"policy 'p': lora.target_modules is empty"):
        check_lora_targets(model, _lora("p", "my/llama", []))
    for good in ("all-linear", ".*q_proj", ["q_proj", "self_attn.v_proj"], ["embed_tokens"]):
        check_lora_targets(model, _lora("p", "my/llama", good))
