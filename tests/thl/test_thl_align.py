"""Hand-derived cases for THL alignment (mutual_rl.thl.align), edge cases and errors."""

import pytest
import torch

from mutual_rl.thl import AlignmentGroup, align_trace, align_traces, alignment_groups
from tests.thl.thl_reference import reference_align, reference_groups

F64 = torch.float64


def aligned(text, src, logps, tgt, granularity="word"):
    return align_trace(text, src, torch.tensor(logps, dtype=F64), tgt, granularity).tolist()


def groups(text, src, tgt, granularity="word"):
    return [(list(g.source), list(g.target)) for g in alignment_groups(text, src, tgt, granularity)]


# "12 + 34": source per character except "34"; target GPT-2 style "12", " +", " 34".
TEXT = "12 + 34"
SRC = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 7)]
LOGP = [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]
TGT = [(0, 2), (2, 4), (4, 7)]


@pytest.mark.parametrize("granularity", ["word", "span"])
def test_digits_and_operator(granularity):
    # words "12" | " +" | " 34": (-1-2), (-3-4), (-5-6)
    assert aligned(TEXT, SRC, LOGP, TGT, granularity) == [-3.0, -7.0, -11.0]
    assert groups(TEXT, SRC, TGT, granularity) == [([0, 1], [0]), ([2, 3], [1]), ([4, 5], [2])]


def test_word_spreads_evenly_span_keeps_finer_groups():
    # text "12+3": one word. source "12","+","3"; target "1","2","+3".
    text, src, logp, tgt = "12+3", [(0, 2), (2, 3), (3, 4)], [-1.0, -2.0, -4.0], [(0, 1), (1, 2), (2, 4)]
    assert aligned(text, src, logp, tgt, "word") == [-7 / 3] * 3
    # span: cut 1 is inside "12", cut 3 inside "+3", cut 2 shared -> [0,2) and [2,4)
    assert aligned(text, src, logp, tgt, "span") == [-0.5, -0.5, -6.0]
    assert groups(text, src, tgt, "span") == [([0], [0, 1]), ([1, 2], [2])]


def test_token_crossing_a_word_boundary_merges_the_words():
    # source "a", "b c", "d" crosses the boundary at 2 ("ab| cd"): one group of 2 target tokens
    assert aligned("ab cd", [(0, 1), (1, 4), (4, 5)], [-1.0, -2.0, -3.0], [(0, 2), (2, 5)]) == [-3.0, -3.0]


def test_overlapping_byte_tokens():
    # byte-level BPE: the two byte tokens of one character share its span (0, 1)
    text, src, logp = "😀 a", [(0, 1), (0, 1), (1, 3)], [-1.0, -3.0, -0.5]
    assert aligned(text, src, logp, [(0, 1), (1, 2), (2, 3)], "word") == [-4.0, -0.25, -0.25]
    assert aligned(text, src, logp, src, "span") == logp  # identity refinement keeps the 1:1 pairs
    assert aligned(text, src, logp, src, "word") == [-2.0, -2.0, -0.5]  # paper: the word is spread evenly
    # partial overlap (0,2) vs (1,3) unions the spans
    assert aligned("abc", [(0, 2), (2, 3)], [-1.0, -2.0], [(0, 1), (1, 3)], "span") == [-1.5, -1.5]


def test_zero_width_eos_joins_the_last_word():
    # "x" | " y"+EOS: source EOS -0.5 and target EOS both in the last group: (-2 - 0.5) / 3
    out = aligned("x y", [(0, 1), (1, 3), (3, 3)], [-1.0, -2.0, -0.5], [(0, 1), (1, 2), (2, 3), (3, 3)])
    assert out == pytest.approx([-1.0, -2.5 / 3, -2.5 / 3, -2.5 / 3], abs=1e-15)
    # identical tokenizations incl. EOS: unchanged under span
    src = [(0, 1), (1, 3), (3, 3)]
    assert aligned("x y", src, [-1.0, -2.0, -0.5], src, "span") == [-1.0, -2.0, -0.5]


def test_zero_width_token_attaches_to_the_following_character():
    # a special/partial token at (2, 2) joins " cd"; a (0, 0) one joins "ab"
    src, logp = [(0, 0), (0, 2), (2, 2), (2, 5)], [-10.0, -1.0, -20.0, -2.0]
    assert aligned("ab cd", src, logp, [(0, 1), (1, 2), (2, 5)]) == [-5.5, -5.5, -22.0]


def test_source_only_segment_merges_into_previous_group():
    # WordPiece has no token for trailing whitespace: the source "\n" mass goes to "hi"
    assert aligned("hi \n", [(0, 2), (2, 4)], [-1.0, -2.0], [(0, 2)]) == [-3.0]
    # nothing before it: merges into the next group instead
    assert aligned("ab", [(0, 1), (1, 2)], [-1.0, -2.0], [(1, 2)], "span") == [-3.0]
    assert groups("ab", [(0, 1), (1, 2)], [(1, 2)], "span") == [([0, 1], [0])]


def test_target_only_group_gets_zero():
    assert aligned("a x", [(0, 1)], [-1.0], [(0, 1), (1, 3)]) == [-1.0, 0.0]
    assert groups("a x", [(0, 1)], [(0, 1), (1, 3)]) == [([0], [0]), ([], [1])]


def test_whitespace_rule_attaches_leading_whitespace_to_the_next_word():
    # "a  b\tc": words "a" | "  b" | "\tc"; leading "  " of the text joins the first word
    assert groups("a  b\tc", [(0, 1), (1, 3), (3, 4), (4, 6)], [(0, 1), (1, 4), (4, 6)]) == \
        [([0], [0]), ([1, 2], [1]), ([3], [2])]
    assert groups("  a b", [(0, 2), (2, 3), (3, 5)], [(0, 3), (3, 5)]) == [([0, 1], [0]), ([2], [1])]


def test_empty_and_degenerate_inputs():
    assert aligned("", [], [], []) == []
    assert aligned("", [(0, 0)], [-0.5], [(0, 0)]) == [-0.5]
    assert aligned("abc", [], [], [(0, 3)]) == [0.0]
    assert alignment_groups("abc", [(0, 3)], []) == [AlignmentGroup((0,), ())]  # nowhere to put the mass
    assert align_traces([], [], [], []) == []
    assert aligned("a\ud800 b", [(0, 2), (2, 4)], [-1.0, -2.0], [(0, 4)]) == [-3.0]  # lone surrogate


def test_batch_matches_single_and_keeps_dtype():
    texts = [TEXT, "", "ab cd", "x y"]
    src = [SRC, [], [(0, 1), (1, 4), (4, 5)], [(0, 1), (1, 3), (3, 3)]]
    logp = [torch.tensor(LOGP), torch.zeros(0), torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-1.0, -2.0, -0.5])]
    tgt = [TGT, [], [(0, 2), (2, 5)], [(0, 1), (1, 3)]]
    for gran in ("word", "span"):
        batch = align_traces(texts, src, logp, tgt, gran)
        assert [b.dtype for b in batch] == [torch.float32] * 4
        for b, args in zip(batch, zip(texts, src, logp, tgt)):
            assert torch.equal(b, align_trace(*args, gran))
    assert align_traces(["ab"], [[(0, 2)]], [[-1.0]], [[(0, 2)]], dtype=F64)[0].dtype == F64


def test_matches_reference_on_awkward_offsets():
    text = "ab  c😀d\n\ne  "
    src = [(0, 0), (0, 1), (1, 3), (3, 5), (5, 6), (5, 6), (6, 7), (7, 9), (9, 12), (12, 12)]
    tgt = [(0, 2), (2, 2), (2, 4), (4, 6), (6, 10), (12, 12)]
    logp = [-0.1 * (i + 1) for i in range(len(src))]
    for gran in ("word", "span"):
        assert groups(text, src, tgt, gran) == reference_groups(text, src, tgt, gran)
        assert aligned(text, src, logp, tgt, gran) == pytest.approx(reference_align(text, src, logp, tgt, gran),
                                                                    abs=1e-12)


@pytest.mark.parametrize("bad", [[(0, 4)], [(2, 1)], [(-1, 1)]])
def test_rejects_spans_outside_the_text(bad):
    with pytest.raises(ValueError, match="not a span"):
        align_trace("abc", bad, [-1.0], [(0, 3)])


def test_rejects_mismatched_lengths_and_granularity():
    with pytest.raises(ValueError, match="lengths"):
        align_trace("abc", [(0, 3)], [-1.0, -2.0], [(0, 3)])
    with pytest.raises(ValueError, match="granularity"):
        align_trace("abc", [(0, 3)], [-1.0], [(0, 3)], "char")
