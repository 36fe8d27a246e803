"""Property tests of the THL invariants over random and adversarial texts and five locally built tokenizers.

Invariants (docs/methods.md §2.2), for every (source family, target family) pair and both granularities:
every source and target token lies in exactly one group; each group's aligned target mass equals its source
mass (1e-9 in float64), hence the sequence's; the fast path equals the pure-Python reference; identical
tokenizers with ``span`` return the trace unchanged.
"""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mutual_rl.thl import align_trace, align_traces, alignment_groups, encode_with_offsets
from tests.thl.conftest import FAMILIES
from tests.thl.thl_reference import reference_groups

ADVERSARIAL = [
    "12345", "3.14159", "-7", "1,000,000", "\\frac{a}{b}", "$x^2$", "\\sum_{i=1}^{n} i", "def f(x):",
    "    return x", "if a==b:\n\t", "{\"k\": [1, 2]}", "   ", "  \t ", "\n\n", "\r\n", "\t", " ", "é", "e\u0301",
    "naïve", "Ünïcödé", "数学题", "答案", "😀", "🦀🦀", "👩‍👩‍👧", "🇫🇷", "\u00a0", "\u3000", "zzzq", "x_1",
    "<|endoftext|>", "</s>", "[UNK]", "ﬁ", "Ⅻ", "\x00", "\x7f",
]
texts = st.lists(st.one_of(st.sampled_from(ADVERSARIAL), st.text(max_size=6),
                           st.text(alphabet=" \t\nab1+", max_size=6)), max_size=10).map("".join)
SETTINGS = settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def traces(toks, src_name, tgt_name, text, seed, eos):
    src_ids, src_off = encode_with_offsets(toks[src_name], text)
    _, tgt_off = encode_with_offsets(toks[tgt_name], text)
    if eos:  # both sides stopped on EOS: zero-width spans at the end
        src_off, tgt_off = src_off + [(len(text), len(text))], tgt_off + [(len(text), len(text))]
    logp = -torch.from_numpy(np.random.default_rng(seed).exponential(2.0, len(src_off)))  # [S] float64
    return src_off, logp, tgt_off


@pytest.mark.slow
@pytest.mark.parametrize("granularity", ["word", "span"])
@pytest.mark.parametrize("src_name", FAMILIES)
@SETTINGS
@given(text=texts, tgt_name=st.sampled_from(FAMILIES), seed=st.integers(0, 2**32 - 1), eos=st.booleans())
def test_mass_conserved_and_each_token_once(toks, src_name, granularity, text, tgt_name, seed, eos):
    src_off, logp, tgt_off = traces(toks, src_name, tgt_name, text, seed, eos)
    out = align_trace(text, src_off, logp, tgt_off, granularity)  # [T] float64
    assert out.shape == (len(tgt_off),) and out.dtype == torch.float64
    grp = alignment_groups(text, src_off, tgt_off, granularity)
    assert sorted(t for g in grp for t in g.target) == list(range(len(tgt_off)))
    assert sorted(s for g in grp for s in g.source) == list(range(len(src_off)))
    assert [(list(g.source), list(g.target)) for g in grp] == reference_groups(text, src_off, tgt_off, granularity)
    for g in grp:
        if g.target:
            assert out[list(g.target)].sum().item() == pytest.approx(logp[list(g.source)].sum().item(), abs=1e-9)
            assert len(set(out[list(g.target)].tolist())) == 1  # evenly redistributed
    if tgt_off:
        assert out.sum().item() == pytest.approx(logp.sum().item(), abs=1e-9)
    # float32 path: tolerance 1e-5 relative to the mass
    out32 = align_trace(text, src_off, logp.float(), tgt_off, granularity)
    assert out32.dtype == torch.float32
    if tgt_off:
        assert abs(out32.double().sum().item() - logp.sum().item()) <= 1e-5 * max(1.0, abs(logp.sum().item()))


@pytest.mark.parametrize("name", FAMILIES)
@SETTINGS
@given(text=texts, seed=st.integers(0, 2**32 - 1), eos=st.booleans())
def test_identical_tokenizers_span_is_identity(toks, name, text, seed, eos):
    src_off, logp, tgt_off = traces(toks, name, name, text, seed, eos)
    assert src_off == tgt_off
    assert torch.equal(align_trace(text, src_off, logp, tgt_off, "span"), logp)


@settings(max_examples=15, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(st.tuples(texts, st.sampled_from(FAMILIES), st.sampled_from(FAMILIES),
                                st.integers(0, 2**32 - 1)), min_size=1, max_size=6),
       granularity=st.sampled_from(["word", "span"]))
def test_batch_equals_single(toks, batch, granularity):
    args = [(text, *traces(toks, a, b, text, seed, eos=True)) for text, a, b, seed in batch]
    got = align_traces(*map(list, zip(*args)), granularity)
    for g, (text, src_off, logp, tgt_off) in zip(got, args):
        assert torch.equal(g, align_trace(text, src_off, logp, tgt_off, granularity))
