"""Benchmark THL alignment against the bare receiver encode of the same texts.

Builds tokenizers locally (GPT-2 style byte-level BPE as the source; SentencePiece-style Unigram and a
byte-level BPE with single-digit splitting as receivers), makes ``--n`` synthetic responses of about ``--tokens`` source tokens (words, numbers, LaTeX,
code, accents, CJK, emoji), and times, interleaved over ``--repeats`` rounds (medians):

- ``encode``: ``receiver(texts, add_special_tokens=False, return_offsets_mapping=True)``;
- ``align``: ``align_traces(texts, source_offsets, source_logps, receiver_offsets, granularity)`` with the
  offsets as the tokenizers return them (lists of tuples), for both granularities.

Prints the ratio align / encode (goal <= 1.5). Usage: ``python scripts/bench_thl.py [--n 10000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from mutual_rl.thl import align_traces

WORDS = ("the answer is so we get let compute sum product of and then therefore hence value number total "
         "first second step equation solve for x y n prime divisible remainder").split()
PIECES = ["\\frac{1}{2}", "$x^2+y^2$", "\\sqrt{n}", "= 42", "3.14159", "1,000", "(a+b)", "f(x):\n    return x",
          "naïve", "café", "数学", "答案", "😀", "\n\n", "  ", "\t", "-7", "x_1", "**Step 2:**"]


def make_texts(n: int, words_per_text: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = [rng.choice(PIECES) if rng.random() < 0.2 else
                 (str(rng.randint(0, 99999)) if rng.random() < 0.1 else rng.choice(WORDS))
                 for _ in range(words_per_text)]
        out.append(" ".join(parts))
    return out


def _byte_bpe(corpus: list[str], vocab_size: int, digits: bool) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if digits else byte_level)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")


def build_tokenizers(corpus: list[str]) -> dict[str, PreTrainedTokenizerFast]:
    """Source ``bpe`` (GPT-2 style) and two receivers: ``unigram`` (SentencePiece style; on this corpus the
    trainer keeps mostly short pieces, ~3 receiver tokens per source token) and ``bpe_digits`` (byte-level
    BPE with single-digit splitting and another vocabulary, ~1 receiver token per source token)."""
    uni = Tokenizer(models.Unigram())
    uni.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    uni.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    uni.train_from_iterator(corpus, trainers.UnigramTrainer(vocab_size=1000, special_tokens=["<unk>", "</s>"],
                                                            unk_token="<unk>"))
    return {"bpe": _byte_bpe(corpus, 2000, digits=False),
            "unigram": PreTrainedTokenizerFast(tokenizer_object=uni, unk_token="<unk>", eos_token="</s>"),
            "bpe_digits": _byte_bpe(corpus, 1200, digits=True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000, help="responses")
    ap.add_argument("--tokens", type=int, default=200, help="approximate source tokens per response")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds (medians)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    toks = build_tokenizers(make_texts(2000, 60, args.seed + 1))
    src_tok = toks.pop("bpe")
    probe = make_texts(200, 100, args.seed)
    per_word = sum(len(src_tok(t, add_special_tokens=False).input_ids) for t in probe) / (200 * 100)
    texts = make_texts(args.n, max(1, round(args.tokens / per_word)), args.seed)
    src = src_tok(texts, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    gen = torch.Generator().manual_seed(args.seed)
    logps = [-torch.rand(len(o), generator=gen, dtype=torch.float64) * 3 for o in src]  # [S_b] each
    n_src = sum(map(len, src))
    print(f"{args.n} responses, {n_src / args.n:.1f} source (bpe) tokens each, {args.repeats} interleaved rounds, "
          f"{os.cpu_count()} CPUs")

    report = {}
    times = {(r, k): [] for r in toks for k in ("encode", "word", "span")}
    for _ in range(args.repeats):
        for name, tok in toks.items():
            t0 = time.perf_counter()
            tgt = tok(texts, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            times[name, "encode"].append(time.perf_counter() - t0)
            for gran in ("word", "span"):
                t0 = time.perf_counter()
                out = align_traces(texts, src, logps, tgt, gran)
                times[name, gran].append(time.perf_counter() - t0)
            err = abs(torch.cat(out).sum().item() - torch.cat(logps).sum().item())
            report[name] = {"target_tokens": sum(map(len, tgt)) / args.n, "mass_error": err}
    for name in toks:
        med = {k: statistics.median(times[name, k]) for k in ("encode", "word", "span")}
        report[name].update({f"median_{k}_s": round(v, 4) for k, v in med.items()})
        report[name].update(ratio_word=round(med["word"] / med["encode"], 3),
                            ratio_span=round(med["span"] / med["encode"], 3))
    print(json.dumps(report, indent=2))
    for name, r in report.items():
        print(f"bpe -> {name}: align/encode ratio word {r['ratio_word']:.2f}x, span {r['ratio_span']:.2f}x "
              f"(goal <= 1.5x; {r['target_tokens']:.0f} receiver tokens per response)")


if __name__ == "__main__":
    main()
