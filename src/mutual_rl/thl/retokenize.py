"""THL text adaptation (retokenization): a peer response crosses to a receiver as text (docs/methods.md §2.1).

Source side: :func:`decode_source` decodes the peer's ids with special tokens skipped and the terminal EOS
removed. Receiver side: :func:`retokenize` encodes the prompt in the receiver's own format and the response
text with ``add_special_tokens=False``, then appends the receiver's EOS iff the source stopped on EOS.

Prompt and response are tokenized **separately and concatenated** (as verl/TRL do for rollouts), so the
response offsets are spans in ``response_text`` itself; at the seam the ids can differ from tokenizing
``prompt + response_text`` jointly (e.g. a SentencePiece prefix space on the first response word).

Round trip: ``decode(response ids without the appended EOS) == response_text`` exactly for byte-level BPE;
for other families up to the receiver's normalisation, which the THL does not undo: characters outside the
vocabulary become the unknown token (its span still covers them), and a normalizer may lowercase, strip
accents or drop control characters and whitespace (BERT WordPiece) — offsets still point into the original
text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from mutual_rl.thl.checks import check_ids, check_text, tokenizer_name
from mutual_rl.thl.offsets import encode_with_offsets


class DecodedSource(NamedTuple):
    """A source response as text: ``text`` (special tokens skipped, terminal EOS removed), ``stopped_on_eos``."""

    text: str
    stopped_on_eos: bool


@dataclass(frozen=True, eq=False)
class Retokenized:
    """A response in the receiver's token space; ``L = prompt_len + R`` with ``R`` response tokens."""

    input_ids: torch.Tensor  # [L] long: prompt ids, response ids, receiver EOS iff the source stopped on EOS
    attention_mask: torch.Tensor  # [L] long: all ones (unpadded)
    response_mask: torch.Tensor  # [L] long: 1 on response tokens incl. the appended EOS, 0 on the prompt
    response_offsets: tuple[tuple[int, int], ...]  # [R] (start, end) in response_text; EOS: (len, len)
    prompt_len: int
    response_text: str

    @property
    def response_ids(self) -> torch.Tensor:
        """Response token ids ``[R]``."""
        return self.input_ids[self.prompt_len:]


def _eos_ids(tokenizer: Any, eos_token_ids: Any) -> set[int]:
    if eos_token_ids is None:
        eos_token_ids = tokenizer.eos_token_id
    if eos_token_ids is None:
        return set()
    if isinstance(eos_token_ids, int):
        return {eos_token_ids}
    return {int(i) for i in eos_token_ids}


def decode_source(tokenizer: Any, response_ids: Any, finish_reason: str | None = None, *,
                  eos_token_ids: int | list[int] | None = None) -> DecodedSource:
    """Decode a source response (its unpadded generated ids ``[R]``) to text.

    ``stopped_on_eos`` is true iff the last id is an EOS id (``eos_token_ids``, default the tokenizer's
    ``eos_token_id``); that EOS is removed and all special tokens are skipped in the text. With
    ``finish_reason == "length"`` (the engine hit the token limit) the response never counts as stopped on
    EOS. The ids are the evidence: a ``"stop"`` on a stop string leaves no EOS id and gives ``False``. Ids that are
    not integers in ``0 .. len(tokenizer) - 1`` are a :class:`~mutual_rl.thl.checks.THLInputError` naming the first.
    """
    ids = check_ids(tokenizer, response_ids, "response_ids", "decode_source")
    eos = _eos_ids(tokenizer, eos_token_ids)
    stopped = finish_reason != "length" and bool(ids) and ids[-1] in eos
    if stopped:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    return DecodedSource(text, stopped)


def special_affixes(tokenizer: Any) -> tuple[list[int], list[int]]:
    """Ids the tokenizer's post-processor puts before and after a single sequence (e.g. Llama: ``[BOS]``, ``[]``).

    Found by encoding a probe with and without special tokens.
    """
    with_sp = list(tokenizer("a", add_special_tokens=True)["input_ids"])
    without = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    for i in range(len(with_sp) - len(without) + 1):
        if with_sp[i:i + len(without)] == without:
            return with_sp[:i], with_sp[i + len(without):]
    raise ValueError(f"cannot find the special tokens that {tokenizer_name(tokenizer)} adds around a sequence")


def prompt_ids(tokenizer: Any, prompt: str, *, chat_template: bool = False) -> list[int]:
    """The receiver's prompt ids ``[P]``.

    ``chat_template=False``: ``prompt`` is already in the receiver's prompt format; it is encoded without
    special tokens and the post-processor's prefix (Llama's BOS) is put in front unless the prompt already
    starts with it; the post-processor's suffix (an EOS/SEP after a single sequence) is dropped because the
    response follows. ``chat_template=True``: ``prompt`` is the user message; the tokenizer's chat template
    is rendered with ``add_generation_prompt=True`` and encoded with ``add_special_tokens=False`` (the
    template writes its own BOS, so no double BOS). A ``prompt`` that is not a ``str`` encodable as UTF-8 (a lone
    surrogate) is a :class:`~mutual_rl.thl.checks.THLInputError`.
    """
    check_text(prompt, "prompt", "prompt_ids")
    if chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"tokenizer {tokenizer_name(tokenizer)} has no chat template")
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                 add_generation_prompt=True, tokenize=False)
        return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    prefix, _ = special_affixes(tokenizer)
    if prefix and ids[:len(prefix)] != prefix:
        ids = prefix + ids
    return ids


def retokenize(tokenizer: Any, prompt: str, response_text: str, stopped_on_eos: bool, *,
               chat_template: bool = False, offsets_fallback: bool = True) -> Retokenized:
    """Build the receiver's input for a peer response given as text (algorithm: module doc).

    ``prompt`` is receiver-formatted text, or with ``chat_template=True`` the user message (see
    :func:`prompt_ids`). ``response_text`` is encoded by :func:`~mutual_rl.thl.offsets.encode_with_offsets`
    (no special tokens, special-token text kept as text, offsets from the fast tokenizer or by decoding when
    ``offsets_fallback``). The receiver's ``eos_token_id`` is appended with a zero-width span
    ``(len(response_text), len(response_text))`` iff ``stopped_on_eos``. A ``prompt`` or ``response_text`` that is
    not a ``str`` encodable as UTF-8 (a lone surrogate) is one :class:`~mutual_rl.thl.checks.THLInputError`.
    """
    check_text(prompt, "prompt", "retokenize")
    check_text(response_text, "response_text", "retokenize")
    p_ids = prompt_ids(tokenizer, prompt, chat_template=chat_template)
    r_ids, offsets = encode_with_offsets(tokenizer, response_text, fallback=offsets_fallback)
    if stopped_on_eos:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {tokenizer_name(tokenizer)} has no eos_token_id to append")
        r_ids.append(int(tokenizer.eos_token_id))
        offsets.append((len(response_text), len(response_text)))
    ids = torch.tensor(p_ids + r_ids, dtype=torch.long)  # [L]
    response_mask = torch.zeros_like(ids)  # [L]
    response_mask[len(p_ids):] = 1
    return Retokenized(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=response_mask,
                       response_offsets=tuple(offsets), prompt_len=len(p_ids), response_text=response_text)
