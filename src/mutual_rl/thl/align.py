"""THL policy-distribution alignment: carry a source log-prob trace onto receiver tokens (docs/methods.md §2.2).

Both tokenizations of the same response text are given as character spans ``(start, end)`` into ``text``
(fast tokenizers' ``return_offsets_mapping``). The algorithm, as implemented:

1. **Candidate cuts.** A cut at character position ``p`` separates character ``p-1`` from ``p``.
   - ``granularity="word"`` (paper): a cut where a whitespace run starts after a non-whitespace character,
     so a group is one whitespace-delimited word *together with the whitespace that precedes it* (the
     leading-space convention of byte-level BPE ``"Ġword"`` and SentencePiece ``"▁word"``); leading
     whitespace of the text belongs to the first word, trailing whitespace forms its own segment.
     Whitespace is Python's ``str.isspace``.
   - ``granularity="span"`` *(ours)*: every position is a candidate, i.e. the finest common segmentation:
     a group closes wherever both tokenizations share a character boundary.
2. **Merge across crossing tokens.** A cut strictly inside any token of either side (``start < p < end``)
   is removed, so tokens that cross a word boundary or overlap each other (byte-level BPE splits a
   multi-byte character into tokens with overlapping spans) land in one segment (union of spans).
3. **Token placement.** A token with ``end > start`` belongs to the segment containing ``start``. A
   zero-width token ``(p, p)`` *(ours)* attaches to the segment containing character ``p`` (the one that
   follows it), or to the last segment when ``p == len(text)``. So a partial-byte or special token that
   incremental decoding places at ``(p, p)`` joins the character it precedes, an appended EOS
   ``(len, len)`` joins the last word, and a ``(0, 0)`` special token joins the first; a zero-width source
   token's log-prob therefore always lands in some group and is conserved.
4. **Empty sides** *(ours)*. A segment with source tokens but no target tokens is merged into the nearest
   previous segment that has target tokens (the next one if there is none before it), so no source mass is
   lost. A segment with target tokens but no source tokens keeps its own group and its tokens get ``0.0``.
   Segments with no tokens at all vanish.
5. **Identity refinement** (``span`` only, *(ours)*). A group whose source and target tokens have pairwise
   identical spans, in sequence order, is split into one-to-one pairs, so identical tokenizers return the
   source trace unchanged (overlapping byte tokens of one character stay distinct).
6. **Redistribution** (paper). For each group ``g`` every target token gets ``sum_{s in S_g} l_s / |T_g|``.

Invariant: ``sum_{t in T_g} aligned_t == sum_{s in S_g} l_s`` for every group, hence for the sequence,
whenever the response has at least one target token (a response with source tokens but *no* target tokens
has nowhere to put the mass: its groups have an empty target list and the aligned trace is empty).

The implementation is vectorised over a whole batch (one numpy pass over the concatenated texts);
accumulation is in float64.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Literal

import numpy as np
import torch

Granularity = Literal["word", "span"]
GRANULARITIES: tuple[str, ...] = ("word", "span")

# Python's str.isspace() characters all lie below U+3001; the extra last entry (False) is for all others.
_WS_LIMIT = 0x3001
_WS_TABLE = np.array([chr(c).isspace() for c in range(_WS_LIMIT)] + [False], dtype=bool)


@dataclass(frozen=True)
class AlignmentGroup:
    """One alignment group: indices of its source tokens and its target (receiver) tokens, ascending."""

    source: tuple[int, ...]
    target: tuple[int, ...]


def _flat_offsets(offsets: Sequence, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate per-response offsets into ``[sum_len, 2]`` int64 plus the lengths ``[B]``."""
    lens = np.fromiter((len(o) for o in offsets), dtype=np.int64, count=len(offsets))
    total = int(lens.sum())
    if total == 0:
        return np.zeros((0, 2), dtype=np.int64), lens
    if any(isinstance(o, (np.ndarray, torch.Tensor)) for o in offsets):
        parts = [np.asarray(o.cpu() if isinstance(o, torch.Tensor) else o, dtype=np.int64).reshape(-1, 2)
                 for o in offsets]
        flat = np.concatenate(parts, axis=0)
    else:
        try:
            flat = np.fromiter(chain.from_iterable(chain.from_iterable(offsets)), dtype=np.int64,
                               count=2 * total).reshape(-1, 2)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{what} must be sequences of (start, end) integer pairs") from err
    if flat.shape[0] != total:
        raise ValueError(f"{what} must be sequences of (start, end) pairs")
    return flat, lens


def _flat_logps(logps: Sequence, lens: np.ndarray) -> np.ndarray:
    """Concatenate per-response source log-probs into ``[sum_len]`` float64, checking the lengths."""
    got = np.fromiter((len(x) for x in logps), dtype=np.int64, count=len(logps))
    if got.shape != lens.shape or np.any(got != lens):
        raise ValueError(f"source_logps lengths {got.tolist()} != source_offsets lengths {lens.tolist()}")
    if int(lens.sum()) == 0:
        return np.zeros(0, dtype=np.float64)
    if any(isinstance(x, torch.Tensor) for x in logps):
        return torch.cat([torch.as_tensor(x).detach().reshape(-1).cpu().double() for x in logps]).numpy()
    return np.fromiter(chain.from_iterable(logps), dtype=np.float64, count=int(lens.sum()))


def _segment_ids(texts: Sequence[str], src: np.ndarray, src_lens: np.ndarray, tgt: np.ndarray,
                 tgt_lens: np.ndarray, granularity: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Final group id of every source ``[S]`` and target ``[T]`` token, global over the batch.

    Group ids are 0..G-1 in text order, then position order. Also returns the response index of each
    group ``[G]``. Each response ``b`` occupies ``len(text_b) + 1`` character slots (the extra slot keeps
    responses apart and anchors zero-width tokens of an empty text).
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    B = len(texts)
    if not (len(src_lens) == len(tgt_lens) == B):
        raise ValueError(f"got {B} texts, {len(src_lens)} source and {len(tgt_lens)} target offset lists")
    n_chars = np.fromiter((len(t) for t in texts), dtype=np.int64, count=B)  # [B]
    slots = n_chars + 1
    base = np.zeros(B, dtype=np.int64)
    np.cumsum(slots[:-1], out=base[1:])
    N = int(slots.sum())
    S = len(src)
    owner = np.concatenate([np.repeat(np.arange(B), src_lens), np.repeat(np.arange(B), tgt_lens)])  # [S+T]
    off = np.concatenate([src, tgt])  # [S+T, 2] local spans
    bad = (off[:, 0] < 0) | (off[:, 1] < off[:, 0]) | (off[:, 1] > n_chars[owner])
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{'source' if i < S else 'target'} offset {tuple(off[i].tolist())} of response "
                         f"{int(owner[i])} is not a span within its text of length {int(n_chars[owner[i]])}")
    gs, ge = off[:, 0] + base[owner], off[:, 1] + base[owner]  # [S+T] global slot positions
    # 1. candidate cuts; cut[c] means a new segment starts at slot c   [N]
    if granularity == "word":
        cp = np.frombuffer(("\x00".join(texts) + "\x00").encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        ws = _WS_TABLE[np.minimum(cp, _WS_LIMIT)]
        cut = np.empty(N, dtype=bool)
        cut[0] = True
        np.greater(ws[1:], ws[:-1], out=cut[1:])  # whitespace here, none before
    else:
        cut = np.ones(N, dtype=bool)
    cut[base] = True
    # 2. remove cuts strictly inside a token: difference array over slots s+1 .. e-1
    wide = ge - gs >= 2
    depth = np.bincount(gs[wide] + 1, minlength=N + 1)
    depth -= np.bincount(ge[wide], minlength=N + 1)
    np.cumsum(depth, out=depth)
    cut &= depth[:N] == 0
    seg = np.cumsum(cut, dtype=np.int32 if N < 2**31 else np.int64)  # [N] segment id + 1 of each slot
    seg -= 1
    n_seg = int(seg[-1]) + 1 if N else 0
    seg_text = np.searchsorted(base, np.flatnonzero(cut), side="right") - 1  # [n_seg] response index
    # 3. token placement: the start char; a zero-width token at p: char p, clamped to the last char
    last = base + np.maximum(n_chars - 1, 0)  # [B]
    seg_all = seg[np.where(ge > gs, gs, np.minimum(gs, last[owner]))].astype(np.int64)  # [S+T]
    seg_s, seg_t = seg_all[:S], seg_all[S:]
    # 4. source-only segments merge into the previous target-bearing segment of the same text, else next
    has_t = np.bincount(seg_t, minlength=n_seg) > 0
    idx = np.arange(n_seg)
    prev = np.maximum.accumulate(np.where(has_t, idx, -1)) if n_seg else idx
    nxt = np.minimum.accumulate(np.where(has_t, idx, n_seg)[::-1])[::-1] if n_seg else idx
    ok_prev = (prev >= 0) & (seg_text[np.clip(prev, 0, None)] == seg_text)
    ok_next = (nxt < n_seg) & (seg_text[np.clip(nxt, None, max(n_seg - 1, 0))] == seg_text)
    home = np.where(has_t, idx, np.where(ok_prev, prev, np.where(ok_next, nxt, idx)))
    seg_s = home[seg_s]
    used = np.zeros(n_seg, dtype=bool)
    used[seg_s] = True
    used[seg_t] = True
    relabel = np.cumsum(used) - 1
    gid_s, gid_t = relabel[seg_s], relabel[seg_t]
    group_text = seg_text[used]
    if granularity == "span":
        gid_s, gid_t, group_text = _split_identical(src, gid_s, tgt, gid_t, group_text)
    return gid_s, gid_t, group_text


def _split_identical(src: np.ndarray, gid_s: np.ndarray, tgt: np.ndarray, gid_t: np.ndarray,
                     group_text: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step 5: split groups whose source and target spans are pairwise identical into 1:1 pairs."""
    G = len(group_text)
    cs, ct = np.bincount(gid_s, minlength=G), np.bincount(gid_t, minlength=G)  # [G]
    cand = (cs == ct) & (cs > 1)
    if not cand.any():
        return gid_s, gid_t, group_text

    def ranks(gid: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        order = np.argsort(gid, kind="stable")
        start = np.cumsum(counts) - counts
        rank = np.empty_like(gid)
        rank[order] = np.arange(len(gid)) - start[gid[order]]
        return order, start, rank

    order_s, start_s, rank_s = ranks(gid_s, cs)
    _, _, rank_t = ranks(gid_t, ct)
    in_cand = cand[gid_t]
    partner = order_s[start_s[gid_t[in_cand]] + rank_t[in_cand]]
    differs = np.any(src[partner] != tgt[in_cand], axis=1)
    paired = cand & (np.bincount(gid_t[in_cand], weights=differs, minlength=G) == 0)
    n_sub = np.where(paired, cs, 1)
    first = np.cumsum(n_sub) - n_sub
    new_s = first[gid_s] + np.where(paired[gid_s], rank_s, 0)
    new_t = first[gid_t] + np.where(paired[gid_t], rank_t, 0)
    return new_s, new_t, np.repeat(group_text, n_sub)


def _out_dtype(dtype: torch.dtype | None, logps: Sequence) -> torch.dtype:
    if dtype is not None:
        return dtype
    first = next((x for x in logps if isinstance(x, torch.Tensor)), None)
    if first is not None and first.is_floating_point():
        return first.dtype
    return torch.get_default_dtype()


def align_traces(texts: Sequence[str], source_offsets: Sequence, source_logps: Sequence, target_offsets: Sequence,
                 granularity: Granularity = "word", *, dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """Batch form of :func:`align_trace`: one aligned trace ``[T_b]`` per response ``b``.

    ``source_offsets[b]`` ``[S_b, 2]`` and ``target_offsets[b]`` ``[T_b, 2]`` are character spans into
    ``texts[b]`` (lists of pairs, arrays or tensors); ``source_logps[b]`` ``[S_b]``. Output dtype: ``dtype``,
    else that of the first tensor in ``source_logps``, else torch's default float dtype.
    """
    if len(texts) == 0:
        return []
    src, src_lens = _flat_offsets(source_offsets, "source_offsets")
    tgt, tgt_lens = _flat_offsets(target_offsets, "target_offsets")
    logp = _flat_logps(source_logps, src_lens)  # [S]
    gid_s, gid_t, group_text = _segment_ids(texts, src, src_lens, tgt, tgt_lens, granularity)
    G = len(group_text)
    mass = np.bincount(gid_s, weights=logp, minlength=G)  # [G] float64
    count_t = np.bincount(gid_t, minlength=G)  # [G]
    values = mass[gid_t] / np.maximum(count_t[gid_t], 1)  # [T]
    out = torch.from_numpy(values).to(_out_dtype(dtype, source_logps))
    return list(torch.split(out, tgt_lens.tolist()))


def align_trace(text: str, source_offsets: Sequence, source_logps: Sequence[float] | torch.Tensor,
                target_offsets: Sequence, granularity: Granularity = "word", *,
                dtype: torch.dtype | None = None) -> torch.Tensor:
    """Aligned source trace ``[T_target]`` on the target tokens of one response (algorithm: module doc).

    Args:
        text: the response text both tokenizations cover.
        source_offsets: ``[S, 2]`` character spans of the source tokens in ``text``.
        source_logps: ``[S]`` source log-probs (``source_logp``), one per source token.
        target_offsets: ``[T, 2]`` character spans of the receiver tokens in ``text``.
        granularity: ``"word"`` (paper) or ``"span"`` *(ours)*.
        dtype: output dtype (default: ``source_logps``' dtype if it is a float tensor, else torch default).
    """
    return align_traces([text], [source_offsets], [source_logps], [target_offsets], granularity, dtype=dtype)[0]


def alignment_groups(text: str, source_offsets: Sequence, target_offsets: Sequence,
                     granularity: Granularity = "word") -> list[AlignmentGroup]:
    """The alignment groups of one response in text order (the structure :func:`align_trace` uses).

    Every target index appears in exactly one group; so does every source index. A group has an empty
    ``source`` when no source token falls in it, and an empty ``target`` only when the response has no
    target tokens at all.
    """
    src, src_lens = _flat_offsets([source_offsets], "source_offsets")
    tgt, tgt_lens = _flat_offsets([target_offsets], "target_offsets")
    gid_s, gid_t, group_text = _segment_ids([text], src, src_lens, tgt, tgt_lens, granularity)
    members_s: list[list[int]] = [[] for _ in range(len(group_text))]
    members_t: list[list[int]] = [[] for _ in range(len(group_text))]
    for i, g in enumerate(gid_s.tolist()):
        members_s[g].append(i)
    for i, g in enumerate(gid_t.tolist()):
        members_t[g].append(i)
    return [AlignmentGroup(tuple(s), tuple(t)) for s, t in zip(members_s, members_t)]
