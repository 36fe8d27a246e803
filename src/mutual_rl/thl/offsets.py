"""Response encoding with character offsets (docs/methods.md §2.3), with a decoding fallback for slow tokenizers."""

from __future__ import annotations

import weakref
from typing import Any

from mutual_rl.thl.checks import check_ids, check_text, tokenizer_name

Offsets = list[tuple[int, int]]


def encode_with_offsets(tokenizer: Any, text: str, *, fallback: bool = True) -> tuple[list[int], Offsets]:
    """Encode ``text`` as a response: ids ``[T]`` and character spans ``[T]`` of each token in ``text``.

    Encoded with ``add_special_tokens=False`` and ``split_special_tokens=True``: a response decoded with
    special tokens skipped can only spell a special token's text through ordinary tokens, so that text must
    stay ordinary text on the receiver side too (no injected ``<|im_end|>``).

    Fast tokenizers give the spans directly (``return_offsets_mapping``). For a tokenizer without offsets
    (slow / Python tokenizers) and ``fallback=True`` the spans are recovered by :func:`offsets_by_decoding`
    *(ours)*, which costs ``O(T^2)`` decoding and needs ``decode(ids) == text``; otherwise, or with
    ``fallback=False``, a ``ValueError`` names the tokenizer. A ``text`` that is not a ``str`` encodable as UTF-8 is
    a :class:`~mutual_rl.thl.checks.THLInputError`.
    """
    check_text(text, "text", "encode_with_offsets")
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
    for i, t in enumerate(texts):
        check_text(t, f"texts[{i}]", "encode_batch_with_offsets")
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
    gives the spans of *sampled* ids, which need not be the canonical encoding of their text. Ids out of the
    tokenizer's range, or a text that is not encodable, are a :class:`~mutual_rl.thl.checks.THLInputError`.
    """
    ids = check_ids(tokenizer, ids, "ids", "offsets_by_decoding")
    check_text(text, "text", "offsets_by_decoding")

    def dec(x: list[int]) -> str:
        return tokenizer.decode(x, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    if dec(ids) != text:
        raise ValueError(f"tokenizer {tokenizer_name(tokenizer)} gives no character offsets and its decode "
                         f"does not reproduce the text exactly, so offsets cannot be recovered")
    spans = _byte_level_spans(tokenizer, ids, text)
    if spans is not None:
        return spans
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


_BYTE_PIECES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _byte_pieces(tokenizer: Any) -> tuple[list[bytes | None], frozenset[int]] | None:
    """For a fast tokenizer whose decoder is exactly ``ByteLevel``: the bytes each vocabulary id decodes to
    (``None`` for ids the byte table cannot spell) and the ids ``decode`` treats apart (added and special tokens);
    ``None`` for every other tokenizer. Built once per tokenizer."""
    if tokenizer in _BYTE_PIECES:
        return _BYTE_PIECES[tokenizer]
    out = None
    backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if backend is not None and type(backend.decoder).__name__ == "ByteLevel":
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        to_byte = {c: b for b, c in bytes_to_unicode().items()}
        apart = frozenset(backend.get_added_tokens_decoder()) | frozenset(tokenizer.all_special_ids)
        pieces: list[bytes | None] = []
        for i in range(backend.get_vocab_size(with_added_tokens=True)):
            token = backend.id_to_token(i)
            pieces.append(None if token is None or any(c not in to_byte for c in token)
                          else bytes(to_byte[c] for c in token))
        out = (pieces, apart)
    _BYTE_PIECES[tokenizer] = out
    return out


def _byte_level_spans(tokenizer: Any, ids: list[int], text: str) -> Offsets | None:
    """:func:`offsets_by_decoding`'s spans from byte arithmetic, without decoding any prefix *(ours)*.

    Applies to a ``ByteLevel`` decoder (GPT-2, Llama 3, Qwen) when every id is an ordinary vocabulary token, their
    bytes are valid UTF-8 and ``text`` is those bytes decoded with no U+FFFD in it; otherwise ``None`` (the
    caller decodes every prefix). Under those conditions a prefix decodes to a prefix of ``text`` exactly when it
    ends on a character boundary (then its length is the number of characters begun in it), and a prefix ending
    inside a character decodes to a trailing U+FFFD that ``text`` does not have there, so the definition's spans
    follow from where each token's bytes end.
    """
    table = _byte_pieces(tokenizer)
    if table is None or "\ufffd" in text:
        return None
    pieces, apart = table
    chunks = []
    for i in ids:
        piece = pieces[i] if 0 <= i < len(pieces) and i not in apart else None
        if piece is None:
            return None
        chunks.append(piece)
    data = b"".join(chunks)
    try:
        if data.decode("utf-8") != text:
            return None
    except UnicodeDecodeError:
        return None
    spans: Offsets = []
    end = pos = chars = 0
    for piece in chunks:
        chars += sum(1 for b in piece if b & 0xC0 != 0x80)  # characters begun in this token's bytes
        pos += len(piece)
        new_end = chars if pos == len(data) or data[pos] & 0xC0 != 0x80 else end  # ends on a boundary
        spans.append((end, new_end))
        end = new_end
    return spans
