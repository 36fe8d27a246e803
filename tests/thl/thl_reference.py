"""A slow, per-character pure-Python reference of the THL grouping rules (align.py's module doc, steps 1-6).

Written independently of the vectorised implementation, to test the fast path against it.
"""

from __future__ import annotations


def reference_groups(text, src, tgt, granularity):
    """List of (source indices, target indices) per group in text order."""
    n = len(text)
    if granularity == "word":
        cuts = {p for p in range(1, n) if text[p].isspace() and not text[p - 1].isspace()}
    else:
        cuts = set(range(1, n))
    for s, e in list(src) + list(tgt):
        cuts -= set(range(s + 1, e))
    cuts = sorted(cuts)

    def segment(s, e):
        anchor = s if e > s else min(s, max(n - 1, 0))
        return sum(1 for c in cuts if c <= anchor)

    n_seg = len(cuts) + 1
    seg_src = [[] for _ in range(n_seg)]
    seg_tgt = [[] for _ in range(n_seg)]
    for i, (s, e) in enumerate(src):
        seg_src[segment(s, e)].append(i)
    for i, (s, e) in enumerate(tgt):
        seg_tgt[segment(s, e)].append(i)
    with_t = [g for g in range(n_seg) if seg_tgt[g]]
    for g in range(n_seg):
        if seg_src[g] and not seg_tgt[g] and with_t:
            before = [h for h in with_t if h < g]
            home = before[-1] if before else min(h for h in with_t if h > g)
            seg_src[home] += seg_src[g]
            seg_src[g] = []
    groups = [(sorted(seg_src[g]), seg_tgt[g]) for g in range(n_seg) if seg_src[g] or seg_tgt[g]]
    if granularity == "span":
        split = []
        for s_idx, t_idx in groups:
            if len(s_idx) == len(t_idx) > 1 and all(tuple(src[a]) == tuple(tgt[b]) for a, b in zip(s_idx, t_idx)):
                split += [([a], [b]) for a, b in zip(s_idx, t_idx)]
            else:
                split.append((s_idx, t_idx))
        groups = split
    return groups


def reference_align(text, src, logps, tgt, granularity):
    out = [0.0] * len(tgt)
    for s_idx, t_idx in reference_groups(text, src, tgt, granularity):
        mass = sum(logps[i] for i in s_idx)
        for t in t_idx:
            out[t] = mass / len(t_idx)
    return out
