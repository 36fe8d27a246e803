"""Response encoding with character offsets (docs/methods.md §2.3), with a decoding fallback for slow tokenizers."""

from __future__ import annotations

from typing import Any

Offsets = list[tuple[int, int]]


def tokenizer_name(tokenizer: Any) -> str:
    """``ClassName('name_or_path')`` for error messages."""
    return f"{type(tokenizer).__name__}({getattr(tokenizer, 'name_or_path', '') or '<unnamed>'!r})"


def encode_with_offsets(tokenizer: Any, text: str, *, fallback: bool = True) -> tuple[list[int], Offsets]:
    """Encode ``text`` as a response: ids ``[T]`` and character spans ``[T]`` of each token in ``text``.

    Encoded with ``add_special_tokens=False`` and ``split_special_tokens=True``: a response decoded with
    special tokens skipped can only spell a special token's text through ordinary tokens, so that text must
    stay ordinary text on the receiver side too (no injected ``<|im_end|>``).

    Fast tokenizers give the spans directly (``return_offsets_mapping``). For a tokenizer without offsets
    (slow / Python tokenizers) and ``fallback=True`` the spans are recovered by :func:`offsets_by_decoding`
    *(ours)*, which costs ``O(T^2)`` decoding and needs ``decode(ids) == text``; otherwise, or with
    ``fallback=False``, a ``ValueError`` names the tokenizer.
    """
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, split_special_tokens=True)
        return list(enc["input_ids"]), [(int(s), int(e)) for s, e in enc["offset_mapping"]]
    if not fallback:
        raise ValueError(f"tokenizer {tokenizer_name(tokenizer)} gives no character offsets "
                         "(return_offsets_mapping needs a fast tokenizer); load it with use_fast=True")
    ids = list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    return ids, offsets_by_decoding(tokenizer, ids, text)


def encode_batch_with_offsets(tokenizer: Any, texts: list[str], *, fallback: bool = True) -> list[tuple[list[int], Offsets]]:
    """:func:`encode_with_offsets` of many responses; one batched call for fast tokenizers (same ids/spans)."""
    if getattr(tokenizer, "is_fast", False) and texts:
        enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, split_special_tokens=True)
        return [(list(ids), [(int(s), int(e)) for s, e in offs])
                for ids, offs in zip(enc["input_ids"], enc["offset_mapping"])]
    return [encode_with_offsets(tokenizer, t, fallback=fallback) for t in texts]


def offsets_by_decoding(tokenizer: Any, ids: list[int], text: str) -> Offsets:
    """Character spans ``[T]`` of ``ids`` in ``text`` by incremental decoding (special tokens skipped).

    Token ``i`` spans from the end of the decoded prefix ``ids[:i]`` to the end of ``ids[:i+1]``; when a
    prefix does not decode to a prefix of ``text`` (a byte token ending inside a multi-byte character
    decodes to U+FFFD) or adds nothing (a special token), the token gets a zero-width span at the current
    end, which alignment attaches to the following character. Spans are monotone and non-overlapping. Also
    gives the spans of *sampled* ids, which need not be the canonical encoding of their text.
    """

    def dec(x: list[int]) -> str:
        return tokenizer.decode(x, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    if dec(ids) != text:
        raise ValueError(f"tokenizer {tokenizer_name(tokenizer)} gives no character offsets and its decode "
                         f"does not reproduce the text exactly, so offsets cannot be recovered")
    backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if backend is not None:  # the Rust decoder directly (same text as ``decode`` without clean-up, ~10x faster;
        # ``decode_batch`` is slower still for short responses: it dispatches to a thread pool)
        prefixes = [backend.decode(ids[: i + 1], skip_special_tokens=True) for i in range(len(ids))]
    else:
        prefixes = [dec(ids[: i + 1]) for i in range(len(ids))]
    spans: Offsets = []
    end = 0
    for prefix in prefixes:
        new_end = len(prefix) if len(prefix) >= end and text.startswith(prefix) else end
        spans.append((end, new_end))
        end = new_end
    return spans
