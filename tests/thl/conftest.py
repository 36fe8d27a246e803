"""Locally built tokenizers of four families for the THL tests (no hub downloads).

Families, each a ``PreTrainedTokenizerFast`` trained on :data:`CORPUS` once per session:

- ``bpe``: GPT-2 style byte-level BPE (no unknowns, exact round trip), EOS ``<|endoftext|>``, no BOS, a
  ChatML chat template.
- ``llama``: byte-level BPE with single-digit splitting and a ``TemplateProcessing`` post-processor that
  adds BOS ``<s>`` (Llama style), EOS ``</s>``, a chat template that writes ``{{ bos_token }}``.
- ``char``: character-level ``WordLevel``; characters outside the corpus map to ``[UNK]``.
- ``unigram``: SentencePiece-style Unigram with ``Metaspace`` (prepend ``first``) and byte fallback
  (Llama-2 style): no unknowns, but the decoder drops one leading space.
- ``wordpiece``: BERT style (``BertNormalizer`` lowercases, strips accents, drops control characters;
  ``BertPreTokenizer``), ``[UNK]`` for words it cannot spell, post-processor ``[CLS] $A [SEP]``.
"""

from __future__ import annotations

import itertools

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

_WORDS = ("the answer is hello world let we compute sum of and then so therefore because number value "
          "function return print if else for while step first second final result prime even odd total").split()
_FRAGMENTS = [
    "Let x = 3.14 and y = \\frac{1}{2}.", "$\\sqrt{x^2 + y^2} = 5$", "\\boxed{42}", "12 + 34 = 46",
    "def f(x):\n    return x + 1\n", "for i in range(10):\n\tprint(i)", "naïve café résumé Ünïcödé",
    "数学题 答案是 七", "emoji 😀 🎉 ok", "a  b   c\n\nd", "1999-2024, 3/4, 0.5%", "x_1, x_2, ..., x_n",
]
CORPUS = [" ".join(_WORDS[(i * 7 + j * 3) % len(_WORDS)] for j in range(6 + i % 5)) + f" {i * 37 % 1000}."
          for i in range(150)] + _FRAGMENTS * 10

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA_TEMPLATE = "{{ bos_token }}{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}"


def build_bpe() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=600, special_tokens=special,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    out = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", name_or_path="local-bpe",
                                  additional_special_tokens=special[1:])
    out.chat_template = CHATML
    return out


def build_llama() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=500, special_tokens=["<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    out = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                  name_or_path="local-llama")
    out.chat_template = LLAMA_TEMPLATE
    return out


def build_char() -> PreTrainedTokenizerFast:
    vocab = {"[UNK]": 0, "</s>": 1}
    for ch in sorted(set("".join(CORPUS))):
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["[UNK]", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="</s>",
                                   name_or_path="local-char")


def build_unigram() -> PreTrainedTokenizerFast:
    meta = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trained = Tokenizer(models.Unigram())
    trained.pre_tokenizer = meta
    trained.train_from_iterator(CORPUS, trainers.UnigramTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>"))
    vocab = [(p, s) for p, s in trained.get_vocab_from_model()] if hasattr(trained, "get_vocab_from_model") \
        else _unigram_vocab(trained)
    low = min(s for _, s in vocab) - 10.0
    vocab += [(f"<0x{b:02X}>", low) for b in range(256)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    tok.pre_tokenizer = meta
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   name_or_path="local-unigram")


def _unigram_vocab(tok: Tokenizer) -> list[tuple[str, float]]:
    import json

    return [(p, float(s)) for p, s in json.loads(tok.to_str())["model"]["vocab"]]


def build_wordpiece() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    special = ["[UNK]", "[CLS]", "[SEP]", "[PAD]"]
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=500, special_tokens=special))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                                   pad_token="[PAD]", eos_token="[SEP]", name_or_path="local-wordpiece")


BUILDERS = {"bpe": build_bpe, "llama": build_llama, "char": build_char, "unigram": build_unigram,
            "wordpiece": build_wordpiece}
FAMILIES = tuple(BUILDERS)
PAIRS = tuple(itertools.product(FAMILIES, FAMILIES))


@pytest.fixture(scope="session")
def toks() -> dict[str, PreTrainedTokenizerFast]:
    """All locally built tokenizers by family name."""
    return {name: build() for name, build in BUILDERS.items()}
