"""Input checks of the THL's API entry points: one clear :class:`THLInputError` instead of a tokenizer's raw error.

Without them, ``decode_source(tok, [-1])`` ended in tokenizers' ``OverflowError: number too small to fit in target
type``, an id past the vocabulary decoded silently to ``""``, a float id was truncated by ``int()``, and a lone
UTF-16 surrogate in a text (``"\\ud800"``) ended in ``TypeError: TextEncodeInput must be Union[...]``.

* :func:`check_text`: a ``str`` that encodes as UTF-8 (no lone surrogate);
* :func:`check_ids`: a sequence (list, tuple, 1-d array or tensor) of integers (``bool`` and floats refused, even
  ``1.0``) each in ``0 .. len(tokenizer) - 1`` (the vocabulary with added tokens; no upper bound for a tokenizer
  without ``len()``); returns them as a list of ``int``;
* :func:`tokenizer_name`: how a tokenizer is named in these and the other THL error messages.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch


def tokenizer_name(tokenizer: Any) -> str:
    """``ClassName('name_or_path')`` for error messages."""
    return f"{type(tokenizer).__name__}({getattr(tokenizer, 'name_or_path', '') or '<unnamed>'!r})"


class THLInputError(ValueError, TypeError):
    """A THL entry point was given ids or text it cannot work on (a ``ValueError`` and a ``TypeError``)."""


def check_text(text: Any, what: str, fn: str) -> str:
    """``text`` if it is a ``str`` that encodes as UTF-8, else :class:`THLInputError` naming ``fn`` and ``what``."""
    if not isinstance(text, str):
        raise THLInputError(f"thl.{fn}: {what} must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start]
        raise THLInputError(
            f"thl.{fn}: {what} is not encodable text: character {e.start} is a lone UTF-16 surrogate {bad!r} "
            f"(U+{ord(bad):04X}, half of a pair), which no tokenizer can encode. Pass valid Unicode: the character "
            f"itself, or join a surrogate pair first (s.encode('utf-16', 'surrogatepass').decode('utf-16'))."
        ) from None
    return text


def _vocab_size(tokenizer: Any) -> int | None:
    try:
        return int(len(tokenizer))
    except TypeError:
        return None


def _as_int_list(ids: Any, what: str, fn: str) -> list[int]:
    if isinstance(ids, torch.Tensor):
        if ids.dim() > 1 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise THLInputError(f"thl.{fn}: {what} must be a 1-d tensor of integer token ids, got a "
                                f"{ids.dim()}-d {ids.dtype} tensor")
        return [int(i) for i in ids.reshape(-1).tolist()]
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise THLInputError(f"thl.{fn}: {what} must be a sequence of integer token ids, got {type(ids).__name__}")
    out = []
    for k, i in enumerate(ids):
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise THLInputError(f"thl.{fn}: {what}[{k}] = {i!r} ({type(i).__name__}) is not an integer token id")
        out.append(int(i))
    return out


def check_ids(tokenizer: Any, ids: Any, what: str, fn: str) -> list[int]:
    """``ids`` as a list of ``int``, each a token id of ``tokenizer`` (module docstring), else
    :class:`THLInputError` naming ``fn``, ``what``, the position, the id and the valid range."""
    out = _as_int_list(ids, what, fn)
    if not out:
        return out
    vocab = _vocab_size(tokenizer)
    low, high = min(out), max(out)
    if low >= 0 and (vocab is None or high < vocab):
        return out
    k = next(k for k, i in enumerate(out) if i < 0 or (vocab is not None and i >= vocab))
    valid = f"0..{vocab - 1}" if vocab is not None else ">= 0"
    raise THLInputError(f"thl.{fn}: {what}[{k}] = {out[k]} is not a token id of {tokenizer_name(tokenizer)} "
                        f"(valid ids: {valid}); were these ids produced by another tokenizer?")


__all__ = ["THLInputError", "check_ids", "check_text", "tokenizer_name"]
