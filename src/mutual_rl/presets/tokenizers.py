"""Locally trained tokenizers for the embedded tiny policies (no downloads).

Two deliberately different families, so that the embedded pair exercises the THL:

- ``char``: one token per character (``WordLevel`` over a fixed character set, ``FixedLength(1)`` split), a
  Llama-style ``<s>`` BOS added by the post-processor, ``</s>`` EOS, unknown characters map to ``<unk>``.
- ``bpe``: GPT-2-style byte-level BPE trained on a small corpus, numbers split into single digits (as Llama-3 and
  Qwen tokenizers do; docs/calibration.md: multi-digit number tokens learn far slower), no BOS, ``<|endoftext|>`` EOS,
  ``Ġ`` space marker.

A third, ``qwen``, is not trained but converted: Qwen's real vocabulary (``presets/qwen_vocab.py``), cached.

Both are returned as ``transformers.PreTrainedTokenizerFast`` (offsets available) with a pad token and left
padding (batched generation needs it).
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

#: Characters the char-level tokenizer knows (the arithmetic task and a little LaTeX).
CHAR_ALPHABET = string.digits + string.ascii_letters + " +-*/=()[]{}\\^_.,:;!?'\"<>|&%$#@~`\n\t"


def corpus_lines(seed: int = 0, count: int = 4000) -> list[str]:
    """A small deterministic training corpus: arithmetic, boxed answers and a little prose."""
    import random

    rng = random.Random(seed)
    words = ["the", "answer", "is", "sum", "of", "and", "so", "we", "get", "therefore", "compute", "value"]
    lines = []
    for _ in range(count):
        a, b = rng.randint(0, 9999), rng.randint(0, 9999)
        op = rng.choice("+-*")
        lines.append(f"{a}{op}{b}={a + b}")
        lines.append(f"\\boxed{{{rng.randint(0, 999)}}}")
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 8))) + ".")
    return lines


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer with a Llama-style BOS (``<s>``) and EOS (``</s>``)."""
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + list(dict.fromkeys(CHAR_ALPHABET)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    return _wrap(tok, bos="<s>", eos="</s>", pad="<pad>", unk="<unk>")


def build_bpe_tokenizer(vocab_size: int = 384, seed: int = 0) -> PreTrainedTokenizerFast:
    """GPT-2-style byte-level BPE with single-digit numbers, trained on :func:`corpus_lines`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(seed), trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return _wrap(tok, bos=None, eos="<|endoftext|>", pad="<|pad|>", unk=None)


def _wrap(tok: Tokenizer, bos: str | None, eos: str, pad: str, unk: str | None) -> PreTrainedTokenizerFast:
    kwargs = {"eos_token": eos, "pad_token": pad}
    if bos is not None:
        kwargs["bos_token"] = bos
    if unk is not None:
        kwargs["unk_token"] = unk
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)
    fast.padding_side = "left"
    return fast


TOKENIZER_BUILDERS = {"char": build_char_tokenizer, "bpe": build_bpe_tokenizer}
"""The trained families (built in seconds, no cache)."""


def tokenizer_for(arch, cache_dir=None) -> PreTrainedTokenizerFast:
    """The tokenizer of preset architecture ``arch`` (its ``tokenizer`` key): a trained family, or the converted
    Qwen vocabulary, cached under the preset cache root ``cache_dir``."""
    if arch.tokenizer == "qwen":
        from mutual_rl.presets.qwen_vocab import load_qwen_tokenizer

        return load_qwen_tokenizer(cache_dir)
    return TOKENIZER_BUILDERS[arch.tokenizer]()
