"""The THL's API entry points check what they are given: an id outside the tokenizer's range or not an integer, and
a text that no tokenizer can encode (a lone UTF-16 surrogate), are one ``THLInputError`` (a ``ValueError`` and a
``TypeError``) naming the function, the argument, the position and the fix. They used to end in tokenizers' raw
``OverflowError: number too small to fit in target type`` / ``TypeError: TextEncodeInput must be Union[...]``, or
to decode an id past the vocabulary silently to ``""``."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from mutual_rl.thl import (
    THLInputError,
    decode_source,
    encode_with_offsets,
    offsets_by_decoding,
    prompt_ids,
    retokenize,
)
from mutual_rl.thl.offsets import encode_batch_with_offsets, tokenizer_name
from tests.reliability import one_glance
from tests.thl.conftest import build_bpe

TOK = build_bpe()
NAME = re.escape(tokenizer_name(TOK))  # e.g. PreTrainedTokenizerFast('local-bpe')


@pytest.mark.parametrize(("ids", "message"), [
    ([5, -1], rf"response_ids\[1\] = -1 is not a token id of {NAME} \(valid ids: 0..599\)"),
    (torch.tensor([600]), rf"response_ids\[0\] = 600 is not a token id of {NAME} \(valid ids: 0..599\); were these "
                          r"ids produced by another tokenizer\?"),
    (np.array([3, 2**40]), r"response_ids\[1\] = 1099511627776 is not a token id"),
    ([1.5], r"response_ids\[0\] = 1.5 \(float\) is not an integer token id"),
    ([True], r"response_ids\[0\] = True \(bool\) is not an integer token id"),
    (torch.tensor([1.0]), r"response_ids must be a 1-d tensor of integer token ids, got a 1-d torch.float32 tensor"),
    ("abc", r"response_ids must be a sequence of integer token ids, got str"),
])
def test_decode_source_refuses_ids_it_cannot_decode_with_one_error(ids, message):
    with one_glance.raises(THLInputError, match=f"^thl.decode_source: .*{message}") as e:
        decode_source(TOK, ids)
    assert isinstance(e.value, ValueError) and isinstance(e.value, TypeError) and e.value.__cause__ is None


def test_valid_ids_of_every_kind_decode_as_before():
    ids = TOK("12 + 34 = 46", add_special_tokens=False)["input_ids"]
    for given in (ids, tuple(ids), torch.tensor(ids), np.array(ids), [np.int64(i) for i in ids]):
        assert decode_source(TOK, given) == ("12 + 34 = 46", False)
    assert decode_source(TOK, ids + [TOK.eos_token_id]) == ("12 + 34 = 46", True)
    assert decode_source(TOK, []) == ("", False)


SURROGATE = r"is not encodable text: character 1 is a lone UTF-16 surrogate '\\ud800' \(U\+D800, half of a pair\)"


@pytest.mark.parametrize(("call", "where"), [
    (lambda: retokenize(TOK, "q\ud800", "46", True), r"thl.retokenize: prompt "),
    (lambda: retokenize(TOK, "12+34=", "4\ud800", True), r"thl.retokenize: response_text "),
    (lambda: prompt_ids(TOK, "q\ud800"), r"thl.prompt_ids: prompt "),
    (lambda: encode_with_offsets(TOK, "4\ud800"), r"thl.encode_with_offsets: text "),
    (lambda: encode_batch_with_offsets(TOK, ["ok", "4\ud800"]), r"thl.encode_batch_with_offsets: texts\[1\] "),
    (lambda: offsets_by_decoding(TOK, [5], "4\ud800"), r"thl.offsets_by_decoding: text "),
])
def test_a_lone_surrogate_is_one_error_naming_the_argument_and_the_fix(call, where):
    with one_glance.raises(THLInputError, match=f"^{where}{SURROGATE}.*surrogatepass") as e:
        call()
    assert e.value.__cause__ is None and e.value.__suppress_context__


def test_a_text_that_is_not_a_str_and_ids_out_of_range_for_offsets_are_one_error():
    with one_glance.raises(THLInputError, match=r"^thl.retokenize: response_text must be a str, got bytes"):
        retokenize(TOK, "q", b"46", False)
    with one_glance.raises(THLInputError, match=r"^thl.offsets_by_decoding: ids\[0\] = 700 is not a token id"):
        offsets_by_decoding(TOK, [700], "x")


def test_a_surrogate_pair_and_other_unicode_still_retokenize():
    r = retokenize(TOK, "12+34=", "😀 café", True)
    assert r.response_text == "😀 café" and r.response_offsets[-1] == (6, 6)
