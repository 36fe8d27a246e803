"""Retokenization (mutual_rl.thl.retokenize / offsets): EOS, BOS, masks, chat templates, round trips."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mutual_rl.thl import (
    align_trace,
    alignment_groups,
    decode_source,
    encode_with_offsets,
    offsets_by_decoding,
    prompt_ids,
    retokenize,
)
from tests.thl.conftest import FAMILIES
from tests.thl.test_thl_properties import texts


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("eos", [True, False])
def test_eos_appended_iff_stopped_and_masks(toks, name, eos):
    tok = toks[name]
    text = "The answer is 42."
    r = retokenize(tok, "Question: 6*7?", text, eos)
    resp_ids, resp_off = encode_with_offsets(tok, text)
    p = r.prompt_len
    assert r.input_ids.dtype == torch.long and r.input_ids.shape == r.attention_mask.shape == r.response_mask.shape
    assert r.input_ids[p:].tolist() == resp_ids + ([tok.eos_token_id] if eos else [])
    assert r.response_offsets == tuple(resp_off) + (((len(text), len(text)),) if eos else ())
    assert r.response_mask.tolist() == [0] * p + [1] * (len(r.input_ids) - p)
    assert r.attention_mask.tolist() == [1] * len(r.input_ids)
    assert len(r.response_offsets) == int(r.response_mask.sum())
    assert torch.equal(r.response_ids, r.input_ids[p:])


def test_bos_only_for_tokenizers_that_add_one(toks):
    llama, bpe = toks["llama"], toks["bpe"]
    r = retokenize(llama, "Hi", "ok", True)
    assert r.input_ids[0].item() == llama.bos_token_id
    assert r.input_ids.tolist().count(llama.bos_token_id) == 1
    assert r.input_ids[1:r.prompt_len].tolist() == llama("Hi", add_special_tokens=False).input_ids
    # a prompt that already starts with BOS gets no second one
    assert prompt_ids(llama, "<s>Hi") == r.input_ids[:r.prompt_len].tolist()
    r = retokenize(bpe, "Hi", "ok", True)
    assert r.input_ids[:r.prompt_len].tolist() == bpe("Hi", add_special_tokens=False).input_ids
    assert r.input_ids.tolist().count(bpe.eos_token_id) == 1 and r.input_ids[-1].item() == bpe.eos_token_id


def test_bert_prefix_kept_suffix_dropped(toks):
    wp = toks["wordpiece"]
    ids = prompt_ids(wp, "what is 6 times 7")
    assert ids[0] == wp.cls_token_id and wp.sep_token_id not in ids
    assert ids[1:] == wp("what is 6 times 7", add_special_tokens=False).input_ids


def test_chat_templates(toks):
    bpe, llama = toks["bpe"], toks["llama"]
    r = retokenize(bpe, "6*7?", "42", True, chat_template=True)
    prompt = bpe.decode(r.input_ids[:r.prompt_len])
    assert prompt == "<|im_start|>user\n6*7?<|im_end|>\n<|im_start|>assistant\n"
    assert r.input_ids[0].item() == bpe.convert_tokens_to_ids("<|im_start|>")
    r = retokenize(llama, "6*7?", "42", False, chat_template=True)
    assert r.input_ids.tolist().count(llama.bos_token_id) == 1 and r.input_ids[0].item() == llama.bos_token_id
    assert llama.decode(r.input_ids[1:r.prompt_len]) == "[INST] 6*7? [/INST]"
    with pytest.raises(ValueError, match=r"TokenizersBackend\(.local-char.\) has no chat template"):
        retokenize(toks["char"], "q", "a", True, chat_template=True)


def test_decode_source(toks):
    bpe = toks["bpe"]
    ids = bpe("x = 1", add_special_tokens=False).input_ids
    im_end = bpe.convert_tokens_to_ids("<|im_end|>")
    assert decode_source(bpe, ids + [bpe.eos_token_id], "stop") == ("x = 1", True)
    assert decode_source(bpe, torch.tensor(ids + [bpe.eos_token_id])) == ("x = 1", True)
    assert decode_source(bpe, ids, "stop") == ("x = 1", False)  # stop string: no EOS id
    assert decode_source(bpe, ids + [bpe.eos_token_id], "length") == ("x = 1", False)
    assert decode_source(bpe, ids[:1] + [im_end] + ids[1:] + [im_end], eos_token_ids=[im_end]) == ("x = 1", True)


def test_special_token_text_stays_text(toks):
    bpe = toks["bpe"]
    text = "a<|endoftext|>b"
    r = retokenize(bpe, "q", text, False)
    assert bpe.eos_token_id not in r.response_ids.tolist()
    assert bpe.decode(r.response_ids) == text and r.response_offsets[-1][1] == len(text)


def expected_decode(tok, name, text):
    """The documented normalisation of each family's round trip (conftest docstring)."""
    if name in ("bpe", "llama"):
        return text
    if name == "unigram":
        return text[1:] if text.startswith(" ") else text
    if name == "char":
        vocab = tok.get_vocab()
        return "".join(c if c in vocab else "[UNK]" for c in text)
    # wordpiece: the normalised words (unknown ones as [UNK]) joined by its decoder (spaces, punctuation cleanup)
    backend = tok.backend_tokenizer
    words = [w for w, _ in backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(text))]
    return backend.decoder.decode(["[UNK]" if backend.model.tokenize(w)[0].value == "[UNK]" else w for w in words])


@pytest.mark.parametrize("name", FAMILIES)
@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts, eos=st.booleans())
def test_round_trip(toks, name, text, eos):
    tok = toks[name]
    r = retokenize(tok, "Q:", text, eos)
    resp = r.response_ids.tolist()[: len(r.response_ids) - int(eos)]
    assert tok.decode(resp, skip_special_tokens=False, clean_up_tokenization_spaces=False) == \
        expected_decode(tok, name, text)
    # offsets: monotone spans in the text that cover every character the tokenizer keeps
    covered = set()
    for (s, e), (s2, _) in zip(r.response_offsets, r.response_offsets[1:] + ((len(text), len(text)),)):
        assert 0 <= s <= e <= len(text) and s <= s2
        covered.update(range(s, e))
    kept = [i for i, c in enumerate(text) if not c.isspace()] if name == "wordpiece" else range(len(text))
    normalizer = tok.backend_tokenizer.normalizer  # BERT drops control characters
    dropped = {i for i, c in enumerate(text) if normalizer is not None and normalizer.normalize_str(c) == ""}
    assert set(kept) - dropped <= covered


class SlowCharTokenizer:
    """A stand-in for a slow tokenizer: no ``is_fast``, no offsets; one id per character (latin-1 only)."""

    name_or_path = "local-slow-char"

    def __call__(self, text, add_special_tokens=False, split_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return "".join(chr(i) for i in ids if i != 0 or not skip_special_tokens)


def test_slow_tokenizer_error_and_fallback():
    slow = SlowCharTokenizer()
    with pytest.raises(ValueError, match=r"SlowCharTokenizer\('local-slow-char'\).*offsets"):
        encode_with_offsets(slow, "ab", fallback=False)
    assert encode_with_offsets(slow, "ab c") == ([97, 98, 32, 99], [(0, 1), (1, 2), (2, 3), (3, 4)])
    # id 0 is a special token: skipped in decoding, zero-width span at the current end
    assert offsets_by_decoding(slow, [97, 0, 98], "ab") == [(0, 1), (1, 1), (1, 2)]
    with pytest.raises(ValueError, match="does not reproduce"):
        offsets_by_decoding(slow, [97], "b")


def test_decoding_offsets_on_partial_bytes(toks):
    bpe = toks["bpe"]
    text = "x = 12 😀🦀 数学"
    ids, _ = encode_with_offsets(bpe, text)
    spans = offsets_by_decoding(bpe, ids, text)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(s == e_prev for (s, _), (_, e_prev) in zip(spans[1:], spans))  # contiguous, monotone
    assert any(s == e for s, e in spans)  # the emoji and CJK bytes do split here
    for i, (s, e) in zip(ids, spans):
        piece = bpe.decode([i])
        if "\ufffd" not in piece:  # a token that decodes on its own spans exactly its text
            assert text[s:e] == piece


@pytest.mark.parametrize("receiver", ["llama", "unigram", "wordpiece", "char"])
def test_pipeline_source_ids_to_receiver_trace(toks, receiver):
    """Sampled source ids -> text -> receiver ids; the source trace (incl. its EOS) lands on receiver tokens."""
    bpe, tok = toks["bpe"], toks[receiver]
    text = "x = 12 😀 数学\n\tdone"
    src_ids = bpe(text, add_special_tokens=False).input_ids + [bpe.eos_token_id]
    src_logp = -torch.linspace(0.1, 2.0, len(src_ids), dtype=torch.float64)  # [S] incl. EOS
    decoded = decode_source(bpe, src_ids, "stop")
    assert decoded == (text, True)
    src_off = offsets_by_decoding(bpe, src_ids[:-1], decoded.text) + [(len(text), len(text))]
    r = retokenize(tok, "Q:", decoded.text, decoded.stopped_on_eos)
    out = align_trace(decoded.text, src_off, src_logp, r.response_offsets)  # [R]
    assert out.shape == (int(r.response_mask.sum()),)
    assert out.sum().item() == pytest.approx(src_logp.sum().item(), abs=1e-9)
    # the last word "done" (after "\n\t") plus both EOS tokens form the last group
    last = alignment_groups(decoded.text, src_off, r.response_offsets)[-1]
    assert last.source[-1] == len(src_ids) - 1 and last.target[-1] == len(r.response_offsets) - 1
    assert text[r.response_offsets[last.target[0]][0]:].strip() == "done"


def _full_prefix_spans(tok, ids, text):
    """The definition of offsets_by_decoding, decoding every prefix (the slow reference)."""
    spans, end = [], 0
    for i in range(len(ids)):
        prefix = tok.decode(ids[: i + 1], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        new_end = len(prefix) if len(prefix) >= end and text.startswith(prefix) else end
        spans.append((end, new_end))
        end = new_end
    return spans


@pytest.mark.parametrize("name", list(FAMILIES))
def test_decoding_offsets_equal_their_definition_on_sampled_ids(toks, name):
    """Random sampled ids (special tokens, split multi-byte characters, non-canonical merges included): the spans
    (decoded with the Rust backend directly) equal the definition decoded with ``tokenizer.decode``, for every
    tokenizer family."""
    tok = toks[name]
    g = torch.Generator().manual_seed(0)
    checked = 0
    for _ in range(60):
        n = int(torch.randint(1, 40, (1,), generator=g))
        ids = torch.randint(0, len(tok), (n,), generator=g).tolist()
        text = tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        try:
            expected = _full_prefix_spans(tok, ids, text)
        except ValueError:
            continue
        assert offsets_by_decoding(tok, ids, text) == expected, (name, ids)
        checked += 1
    for text in ["x = 12 😀🦀 数学", "naïve café 7", "12 + 34 = 46"]:  # canonical encodings too
        ids = tok(text, add_special_tokens=False)["input_ids"]
        decoded = tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        assert offsets_by_decoding(tok, ids, decoded) == _full_prefix_spans(tok, ids, decoded)
    assert checked >= 50


def test_byte_level_spans_equal_their_definition(toks):
    """The byte-arithmetic spans of a ByteLevel tokenizer (the fast path of offsets_by_decoding) equal the
    definition: canonical texts with multi-byte characters split across tokens, and sampled ids whose bytes happen
    to be valid UTF-8; ids decode treats apart, invalid bytes and U+FFFD in the text fall back to decoding."""
    from mutual_rl.thl.offsets import _byte_level_spans

    bpe = toks["bpe"]
    assert type(bpe.backend_tokenizer.decoder).__name__ == "ByteLevel"
    for name in toks:  # the other families are not byte-level: no fast path
        if type(toks[name].backend_tokenizer.decoder).__name__ != "ByteLevel":
            assert _byte_level_spans(toks[name], [1], toks[name].decode([1])) is None
    split = 0
    for text in ["x = 12 😀🦀 数学", "naïve café 7", "12 + 34 = 46", " leading space\n\ttab"]:
        ids = bpe(text, add_special_tokens=False)["input_ids"]
        decoded = bpe.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        fast = _byte_level_spans(bpe, ids, decoded)
        assert fast is not None and fast == _full_prefix_spans(bpe, ids, decoded), text
        split += sum(s == e for s, e in fast)
    assert split > 0  # some token ended inside a character
    g = torch.Generator().manual_seed(1)
    fast_taken = 0
    for _ in range(600):
        ids = torch.randint(0, len(bpe), (int(torch.randint(1, 16, (1,), generator=g)),), generator=g).tolist()
        text = bpe.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        fast = _byte_level_spans(bpe, ids, text)
        if fast is not None:
            fast_taken += 1
            assert fast == _full_prefix_spans(bpe, ids, text), ids
        elif "\ufffd" not in text and not set(ids) & set(bpe.all_special_ids):
            raise AssertionError(f"valid ordinary ids fell back: {ids}")
    assert fast_taken >= 50
    ids = bpe("46", add_special_tokens=False)["input_ids"]
    assert _byte_level_spans(bpe, ids + [bpe.eos_token_id], "46") is None  # a special id: decoded the slow way
    assert offsets_by_decoding(bpe, ids + [bpe.eos_token_id], "46") == _full_prefix_spans(bpe, ids + [bpe.eos_token_id], "46")
    emoji = bpe("😀", add_special_tokens=False)["input_ids"]
    if len(emoji) > 1:  # its first byte token alone is invalid UTF-8 and decodes to U+FFFD
        head = bpe.decode(emoji[:1], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        assert _byte_level_spans(bpe, emoji[:1], head) is None
        assert offsets_by_decoding(bpe, emoji[:1], head) == _full_prefix_spans(bpe, emoji[:1], head)
