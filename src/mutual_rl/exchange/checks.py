"""Stored traffic's integrity: the digest written with each rollout record and the cross-checks run on every
record read back (:func:`check_stored_record`: one log-prob and one span per token, spans in order inside the text
and ending at its end, ids >= 0, finite log-probs <= 0, finite rewards and advantages, the digest). Used by
:mod:`mutual_rl.exchange.store`, which names the file and line of a record that fails."""

from __future__ import annotations

import hashlib
import json
import math
import operator
import struct
from itertools import chain


def rollout_digest(d: dict, flat_offsets: list | None = None) -> str:
    """A 128-bit BLAKE2b hash of every field of an encoded rollout record except ``"digest"`` (identity, texts,
    finish reason, dtypes, token ids, log-prob values, offsets): written with the record, checked on reading.
    ``flat_offsets``: the offsets flattened, when the caller has them."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps([d["policy_id"], d["prompt_id"], d["group_id"], d["step"], d["policy_version"],
                         d["prompt_text"], d["response_text"], d["finish_reason"], d["prompt_ids"]["dtype"],
                         d["response_ids"]["dtype"], d["logp"]["dtype"]]).encode())
    offsets = flat_offsets if flat_offsets is not None else list(chain.from_iterable(d["offsets"]))
    for fmt, values in (("q", d["prompt_ids"]["data"]), ("q", d["response_ids"]["data"]), ("d", d["logp"]["data"]),
                        ("q", offsets)):
        h.update(struct.pack(f"<q{len(values)}{fmt}", len(values), *values))
    return h.hexdigest()


_FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
_INT_DTYPES = frozenset({"int64", "int32"})
_FINISH = ("eos", "length")
_INT = {int}


def record_name(d: dict) -> str:
    """``rollout record (policy 'a', prompt 3, group 0)``: how errors name a stored record."""
    kind = d.get("kind", "?")
    extra = "" if kind == "rollout" else f", response {d.get('index')!r}"
    if kind == "trace":
        extra += f", receiver {d.get('receiver_id')!r}"
    return (f"{kind} record (policy {d.get('policy_id')!r}, prompt {d.get('prompt_id')!r}, "
            f"group {d.get('group_id')!r}{extra})")


def _is_int(x) -> bool:
    return type(x) is int


def _ids_problem(name: str, t: dict) -> str | None:
    if t["dtype"] not in _INT_DTYPES or len(t["shape"]) != 1:
        return f"{name} must be a 1-D integer tensor (got dtype {t['dtype']!r}, shape {t['shape']})"
    data = t["data"]
    if not set(map(type, data)) <= _INT or (data and min(data) < 0):  # C-level passes: ~10 us per 1000 ids
        bad = next(k for k, x in enumerate(data) if not _is_int(x) or x < 0)
        return f"{name}[{bad}] = {data[bad]!r} is not a token id (an integer >= 0)"
    return None


def _logp_problem(name: str, t: dict) -> str | None:
    if t["dtype"] not in _FLOAT_DTYPES or len(t["shape"]) != 1:
        return f"{name} must be a 1-D float tensor (got dtype {t['dtype']!r}, shape {t['shape']})"
    data = t["data"]
    if not all(map(math.isfinite, data)) or (data and max(data) > 0):
        bad = next(k for k, x in enumerate(data) if not math.isfinite(x) or x > 0)
        return f"{name}[{bad}] = {data[bad]!r}: a log-prob must be finite and <= 0"
    return None


def _flat_offsets(offsets) -> list | None:
    """``[s0, e0, s1, e1, ...]``, or ``None`` when a span is not a pair."""
    if not isinstance(offsets, list) or not set(map(len, offsets)) <= {2}:
        return None
    return list(chain.from_iterable(offsets))


def _bad_span(offsets, n: int) -> str:
    end = 0
    for k, span in enumerate(offsets):
        a, b = (list(span) + [None, None])[:2] if isinstance(span, (list, tuple)) else (span, None)
        if not (_is_int(a) and _is_int(b) and len(span) == 2 and end <= a <= b <= n):
            return (f"offsets[{k}] = {json.dumps(span)}: spans must be [start, end] pairs in response_text ({n} "
                    f"characters), in order and without overlap (the previous span ends at {end})")
        end = b
    return f"offsets {offsets!r} are not spans in order inside response_text ({n} characters)"


def check_stored_record(d: dict) -> str | None:
    """What is wrong with the stored record ``d`` (a decoded JSON line whose fields are all present), or ``None``.

    Rollout: ``prompt_ids``/``response_ids`` integer ids >= 0; one ``logp`` value and one ``offsets`` span per
    response token; log-probs finite and <= 0; spans ``0 <= start <= end <= len(response_text)``, in order and not
    overlapping, the last ending at the end of the text (the engines' spans tile the decoded text, so a text of
    another length than its tokens' is caught here); ``finish_reason`` ``eos`` or ``length``; and, when the
    record has one, its ``digest`` (:func:`rollout_digest`: any field edited after recording). Reward and
    advantage: a finite ``value`` and an ``index`` >= 0. Trace: a finite ``source_logp`` <= 0."""
    for f in ("prompt_id", "group_id", "step", "policy_version"):
        if not _is_int(d[f]):
            return f"{f} must be an integer, got {d[f]!r}"
    if not isinstance(d["policy_id"], str):
        return f"policy_id must be a string, got {d['policy_id']!r}"
    kind = d["kind"]
    if kind == "rollout":
        for name in ("prompt_ids", "response_ids"):
            if problem := _ids_problem(name, d[name]):
                return problem
        if problem := _logp_problem("logp", d["logp"]):
            return problem
        n = len(d["response_ids"]["data"])
        if len(d["logp"]["data"]) != n:
            return (f"logp has {len(d['logp']['data'])} values but response_ids has {n} tokens (one behaviour "
                    f"log-prob per sampled token)")
        offsets, text = d["offsets"], d["response_text"]
        if not isinstance(text, str) or not isinstance(d["prompt_text"], str):
            return "prompt_text and response_text must be strings"
        if len(offsets) != n:
            return f"offsets has {len(offsets)} spans but response_ids has {n} tokens (one span per token)"
        flat = _flat_offsets(offsets)
        # spans in order, inside the text, without overlap <=> 0 <= s0 <= e0 <= s1 <= ... <= len(text)
        if (flat is None or not set(map(type, flat)) <= _INT or (flat and (flat[0] < 0 or flat[-1] > len(text)))
                or not all(map(operator.le, flat, flat[1:]))):
            return _bad_span(offsets, len(text))
        end = flat[-1] if flat else 0
        if end != len(text):
            return (f"the offsets end at character {end} but response_text has {len(text)} characters: the text "
                    f"is not the one its response_ids and logp were sampled with (an edited response_text?)")
        if d["finish_reason"] not in _FINISH:
            return f"finish_reason {d['finish_reason']!r} is not one of {', '.join(_FINISH)}"
        if "digest" in d and d["digest"] != rollout_digest(d, flat):
            return ("the record differs from what was recorded (its digest does not match its fields): it was "
                    "edited after recording -- e.g. a response_text replaced while response_ids, logp and offsets "
                    "stayed those of the old text, which would train on one text with another's tokens and "
                    "log-probs. Restore the original step file, or record the run again")
        return None
    if kind in ("reward", "advantage"):
        v = d["value"]
        if not (type(v) in (int, float) and math.isfinite(v)):
            what = "reward" if kind == "reward" else "advantage"
            return (f"value {v!r} is not a finite number: a stored {what} must be finite (a run refuses "
                    f"non-finite {what}s before training on them, so a recording never holds one)")
        if d["dtype"] not in _FLOAT_DTYPES:
            return f"dtype {d['dtype']!r} is not a float dtype ({', '.join(sorted(_FLOAT_DTYPES))})"
        if not _is_int(d["index"]) or d["index"] < 0:
            return f"index {d['index']!r} must be an integer >= 0"
        return None
    if kind == "trace":
        if not _is_int(d["index"]) or d["index"] < 0:
            return f"index {d['index']!r} must be an integer >= 0"
        return _logp_problem("source_logp", d["source_logp"])
    return None


