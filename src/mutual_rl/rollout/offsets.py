"""Character offsets of *sampled* token ids in their decoded text.

Re-encoding the decoded text would give the tokenizer's canonical tokenization, which need not be the sampled
one; so offsets come from incremental decoding instead: token ``i`` spans from the end of the decoded prefix
``ids[:i]`` to the end of ``ids[:i+1]``. When a prefix does not decode to a prefix of the full text (a
byte-level BPE token that ends inside a multi-byte character decodes to U+FFFD), the token gets a zero-width
span at the current end and the characters go to the token that completes them; spans are therefore monotone,
non-overlapping, and cover the text exactly. Special tokens get zero-width spans.
"""

from __future__ import annotations

from collections.abc import Sequence


def incremental_offsets(tokenizer, ids: Sequence[int], text: str | None = None) -> tuple[tuple[int, int], ...]:
    """(start, end) spans of ``ids`` in ``text`` (default: ``decode(ids, skip_special_tokens=True)``)."""
    ids = list(ids)
    if text is None:
        text = tokenizer.decode(ids, skip_special_tokens=True)
    spans = []
    end = 0
    for i in range(len(ids)):
        prefix = tokenizer.decode(ids[: i + 1], skip_special_tokens=True)
        new_end = len(prefix) if len(prefix) >= end and text.startswith(prefix) else end
        spans.append((end, new_end))
        end = new_end
    if end != len(text) and spans:  # trailing characters only a later normalisation produced
        spans[-1] = (spans[-1][0], len(text))
    return tuple(spans)
