"""MutualFSDPStrategy on CPU without a process group: it constructs, rejects bad options, parses from the CLI, and
its wrap policy selects every decoder layer of the tiny GPT-2 and Llama presets (each policy's model is its own FSDP
root). Real two-rank FSDP runs are in tests/distributed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mutual_rl.model.policy import build_policy
from mutual_rl.strategies import MutualFSDPStrategy, clip_grad_norm_, decoder_layer_names, full_params
from tests.module.helpers import pair


@pytest.fixture(scope="module")
def policies():
    root = nn.ModuleDict()
    for spec in pair(lora=False):
        root[spec.name] = build_policy(spec)
    return root


def _selected(strategy, root):
    policy = strategy.auto_wrap_policy(root)
    chosen = policy._run_policy(root, set(), {})
    return {name for name, m in root.named_modules() if m in chosen}


def test_constructs_with_options():
    s = MutualFSDPStrategy(decoder_layers=["GPT2Block"], mixed_precision="bf16", activation_checkpointing=True)
    assert s.kwargs["use_orig_params"] is True
    mp = s.mixed_precision
    # bf16 compute; gradients reduced and buffers (rotary inv_freq) held in float32
    assert (mp.param_dtype, mp.reduce_dtype, mp.buffer_dtype) == (torch.bfloat16, torch.float32, torch.float32)
    assert MutualFSDPStrategy().mixed_precision is None


@pytest.mark.parametrize("precision, param", [("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16),
                                              ("32-true", torch.float32)])
def test_lightning_precision_keeps_float32_reduction_and_buffers(precision, param):
    """mixed_precision: null follows trainer.precision as Lightning maps it (bf16-mixed: bf16 parameters, and --
    Lightning's own choice -- bf16 buffers and reduction), corrected to float32 buffers and reduction."""
    from lightning.pytorch.plugins.precision import FSDPPrecision

    s = MutualFSDPStrategy()
    s.precision_plugin = FSDPPrecision(precision)
    assert FSDPPrecision(precision).mixed_precision_config.buffer_dtype == param  # what Lightning alone gives
    mp = s.mixed_precision_config
    assert (mp.param_dtype, mp.reduce_dtype, mp.buffer_dtype) == (param, torch.float32, torch.float32)


@pytest.mark.parametrize("kw, match", [(dict(mixed_precision="int8"), "mixed_precision"),
                                      (dict(use_orig_params=False), "use_orig_params")])
def test_rejects_bad_options(kw, match):
    with pytest.raises(ValueError, match=match):
        MutualFSDPStrategy(**kw)


def test_discovers_decoder_layers_of_both_policies(policies):
    assert decoder_layer_names(policies) >= {"GPT2Block", "LlamaDecoderLayer"}


@pytest.mark.parametrize("layers", [None, ["GPT2Block", "LlamaDecoderLayer"]])
def test_wrap_policy_selects_every_decoder_layer(policies, layers):
    # inside each policy's own FSDP root (its model), one nested unit per decoder layer; nothing else
    chosen = _selected(MutualFSDPStrategy(decoder_layers=layers), policies)
    assert chosen == {f"gpt2.model.transformer.h.{i}" for i in range(4)} | {
        f"llama.model.model.layers.{i}" for i in range(4)}


def test_checkpoint_classes_are_the_decoder_layers(policies):
    layers = MutualFSDPStrategy(activation_checkpointing=True).layer_classes(policies)
    assert {c.__name__ for c in layers} == {"GPT2Block", "LlamaDecoderLayer"}


def test_unknown_layer_name_is_a_clear_error(policies):
    with pytest.raises(ValueError, match="Qwen3DecoderLayer"):
        MutualFSDPStrategy(decoder_layers=["Qwen3DecoderLayer"]).layer_classes(policies)


def test_lora_model_layers_are_found():
    root = nn.ModuleDict({"g": build_policy(pair(lora=True)[0])})
    chosen = _selected(MutualFSDPStrategy(), root)
    assert len(chosen) == 4 and all(n.endswith(tuple(f"h.{i}" for i in range(4))) for n in chosen)


@pytest.mark.parametrize("sharding", ["HYBRID_SHARD", "NO_SHARD"])
def test_replicating_sharding_strategies_are_rejected(sharding):
    with pytest.raises(ValueError, match="FULL_SHARD, SHARD_GRAD_OP"):
        MutualFSDPStrategy(sharding_strategy=sharding)


def test_only_a_module_with_policies_can_be_sharded():
    with pytest.raises(ValueError, match="MutualRLModule"):
        MutualFSDPStrategy()._setup_model(nn.Linear(2, 2))


def test_compiled_policies_are_refused_before_sharding():
    import dataclasses

    spec = dataclasses.replace(pair(lora=False)[0], compile=True)
    holder = nn.Module()
    holder.policies = nn.ModuleDict({spec.name: build_policy(spec)})
    with pytest.raises(ValueError, match="compile: true is not supported under MutualFSDPStrategy"):
        MutualFSDPStrategy()._setup_model(holder)
    assert type(holder.policies[spec.name].model).__name__ != "FullyShardedDataParallel"  # nothing was wrapped


def test_clip_and_full_params_without_distributed():
    lin = nn.Linear(3, 2)
    lin(torch.ones(1, 3)).sum().mul(100).backward()
    ref = torch.nn.utils.get_total_norm([p.grad for p in lin.parameters()])
    assert float(clip_grad_norm_(list(lin.parameters()), 1.0)) == pytest.approx(float(ref))
    assert float(torch.nn.utils.get_total_norm([p.grad for p in lin.parameters()])) == pytest.approx(1.0, rel=1e-5)
    with full_params(lin) as m:
        assert m is lin


@pytest.mark.slow
def test_parses_from_cli(tmp_path):
    from mutual_rl.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["fit", "--model.policies", '[{"name": "a", "model": "tiny:gpt2-bpe"}]',
              "--trainer.strategy", "mutual_rl.strategies.MutualFSDPStrategy",
              "--trainer.strategy.decoder_layers", '["GPT2Block"]', "--trainer.strategy.mixed_precision", "bf16",
              "--print_config"])
    assert exc.value.code == 0
