"""On-disk exchange traffic: one schema-versioned JSONL file per training step, written atomically.

File ``<store_dir>/step-<step:06d>.jsonl``:

* line 1, the header: ``{"format": "mutual_rl.exchange", "schema_version": 1, "step": s, "record_kinds": [...],
  "policies": [...], "num_records": N, "counts": {kind: count}, "flows": {...}, "run_id": "..."}`` (``flows`` is
  the step's accounting, informational only; ``run_id`` names the recording run, see "Ownership" below; files
  written before run ids have none);
* lines 2..N+1, one record each: ``{"kind": "rollout" | "reward" | "advantage" | "trace", <fields>}``. Tensors are
  ``{"dtype": "float32", "shape": [T], "data": [...]}``; floats are written with Python's shortest round-trip
  ``repr`` (JSON numbers; ``NaN``/``Infinity`` as Python's ``json`` writes them), which represents every
  float16/bfloat16/float32/float64 value exactly, so log-probs, rewards and advantages read back bit-identical.
  A rollout record also carries ``"digest"``: a hash of all its other fields (:func:`rollout_digest`), so a
  response text edited apart from the token ids, log-probs and offsets it was sampled with is caught on reading
  (the recorded policy's tokenizer is not at hand to re-decode the ids).

Writes go to a temporary file in the same directory, are flushed and fsync'ed, then ``os.replace``'d onto the
final name (and the directory is fsync'ed), so a reader sees a whole step or none. Reading validates everything
and raises :class:`StoredTrafficError` naming the file (and the line) for a missing step, an unknown schema
version, invalid JSON (e.g. a line truncated mid-way), a missing final newline, a missing field, or a record
count that disagrees with the header -- never a silent partial step. Every record is also cross-checked
(:func:`check_stored_record`; the error names the file, the line and the record's policy, prompt and group): one
log-prob and one character span per response token, spans in order inside the response text and ending at its
end, token ids that are integers >= 0, log-probs and traces finite and <= 0, rewards and advantages finite, a
known finish reason, the rollout's digest; a trace must belong to a response of the file.

Ownership: a store folder holds one run's recording. :func:`check_store_owner` refuses a folder whose step files
were written by another run (their headers' ``run_id``), so a second run never overwrites a first one's steps;
the same run resumed from its checkpoint (which holds its run id) keeps recording, and
:func:`set_aside_steps` moves the steps it recorded after that checkpoint into a ``superseded-from-step-<s>``
sub-folder (kept, never replayed) before it records them again. :func:`check_store_not_replay` refuses a
``store_dir`` that is, contains or lies inside the ``replay_dir`` being read.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
import os
import re
import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields
from itertools import chain
from pathlib import Path

import torch

from mutual_rl.durable import fsync_dir
from mutual_rl.exchange.records import (
    RECORD_KINDS,
    AdvantageRecord,
    Record,
    RewardRecord,
    TraceRecord,
    dtype_from_name,
    dtype_name,
    record_kind,
)
from mutual_rl.types import Rollout

SCHEMA_VERSION = 1
FORMAT = "mutual_rl.exchange"
_STEP_FILE = re.compile(r"^step-(\d+)\.jsonl$")
_TENSOR_FIELDS = {"prompt_ids", "response_ids", "logp", "source_logp"}
_CLASSES = {"rollout": Rollout, "reward": RewardRecord, "advantage": AdvantageRecord, "trace": TraceRecord}


class StoredTrafficError(ValueError):
    """A stored exchange file is missing, of another schema version, truncated, corrupt or edited."""


class StoreInUseError(StoredTrafficError):
    """A ``store_dir`` already holds another run's recording (or is the folder a replay reads)."""


def step_path(store_dir: str | os.PathLike, step: int) -> Path:
    return Path(store_dir) / f"step-{step:06d}.jsonl"


def stored_steps(store_dir: str | os.PathLike) -> list[int]:
    """The steps that have a file in ``store_dir``, sorted (temporary files are ignored)."""
    d = Path(store_dir)
    if not d.is_dir():
        return []
    return sorted(int(m.group(1)) for p in d.iterdir() if (m := _STEP_FILE.match(p.name)))


# ------------------------------------------------------------------------------------------- encoding
def _encode_tensor(t: torch.Tensor) -> dict:
    return {"dtype": dtype_name(t), "shape": list(t.shape), "data": t.detach().cpu().reshape(-1).tolist()}


def _decode_tensor(d: dict) -> torch.Tensor:
    return torch.tensor(d["data"], dtype=dtype_from_name(d["dtype"])).reshape(d["shape"])


def encode_record(record: Record) -> dict:
    """A JSON-ready dict of one record (``{"kind": ..., <fields>}``; a rollout also gets its ``"digest"``)."""
    out = {"kind": record_kind(record)}
    for f in fields(record):
        v = getattr(record, f.name)
        if isinstance(v, torch.Tensor):
            v = _encode_tensor(v)
        elif f.name == "offsets":
            v = [list(span) for span in v]
        out[f.name] = v
    if out["kind"] == "rollout":
        out["digest"] = rollout_digest(out)
    return out


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


def decode_record(d: dict) -> Record:
    """Inverse of :func:`encode_record`; raises ``KeyError``/``ValueError``/``TypeError`` on a malformed dict."""
    kind = d["kind"]
    if kind not in _CLASSES:
        raise ValueError(f"unknown record kind {kind!r} (kinds: {', '.join(RECORD_KINDS)})")
    cls = _CLASSES[kind]
    kwargs = {}
    for f in fields(cls):
        if f.name not in d:
            raise KeyError(f.name)
        v = d[f.name]
        if f.name in _TENSOR_FIELDS:
            v = _decode_tensor(v)
        elif f.name == "offsets":
            v = tuple((int(a), int(b)) for a, b in v)
        kwargs[f.name] = v
    return cls(**kwargs)


# ------------------------------------------------------------------------------------------- writing
def write_step(store_dir: str | os.PathLike, step: int, records: Sequence[Record], flows: dict | None = None,
               run_id: str | None = None) -> Path:
    """Atomically write one step's records to ``step-<step>.jsonl``; returns the final path. ``run_id``: the
    recording run's id, written into the header (``None``: no ``run_id`` key)."""
    path = step_path(store_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    counts = Counter(record_kind(r) for r in records)
    header = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "step": step,
        "record_kinds": list(RECORD_KINDS),
        "policies": sorted({r.policy_id for r in records}),
        "num_records": len(records),
        "counts": {k: counts.get(k, 0) for k in RECORD_KINDS},
        "flows": flows or {},
    }
    if run_id is not None:
        header["run_id"] = run_id
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(header) + "\n")
            for r in records:
                fh.write(json.dumps(encode_record(r)) + "\n")  # ASCII: lone surrogates survive
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path




# ------------------------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class StoredStep:
    """One step file, parsed and validated."""

    path: Path
    step: int
    header: dict
    records: tuple[Record, ...]

    @property
    def run_id(self) -> str | None:
        """The recording run's id (``None`` for a file written before run ids)."""
        return self.header.get("run_id")


def read_step(store_dir: str | os.PathLike, step: int) -> StoredStep:
    """Read and validate ``step-<step>.jsonl`` in ``store_dir`` (see the module docstring for the checks)."""
    path = step_path(store_dir, step)
    if not path.is_file():
        have = stored_steps(store_dir)
        span = f"steps {have[0]}..{have[-1]} ({len(have)} files)" if have else "no step files"
        raise StoredTrafficError(f"missing stored exchange file {path} for step {step}; {store_dir} has {span}")
    return read_step_file(path, expected_step=step)


def read_step_file(path: str | os.PathLike, expected_step: int | None = None) -> StoredStep:
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if not text:
        raise StoredTrafficError(f"{path}: empty file (no header line)")
    lines = text.split("\n")
    if lines[-1] != "":
        raise StoredTrafficError(
            f"{path}:{len(lines)}: last line has no terminating newline -- the file is truncated"
        )
    lines = lines[:-1]
    header = _parse(path, 1, lines[0])
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise StoredTrafficError(f"{path}:1: not a mutual_rl exchange header (expected format {FORMAT!r})")
    version = header.get("schema_version")
    if version != SCHEMA_VERSION:
        raise StoredTrafficError(
            f"{path}:1: schema_version {version!r} is not supported (this mutual_rl reads schema_version "
            f"{SCHEMA_VERSION})"
        )
    step = header.get("step")
    if expected_step is not None and step != expected_step:
        raise StoredTrafficError(f"{path}:1: header says step {step!r}, but the file name says step {expected_step}")
    records = []
    groups: dict[tuple, int] = {}  # (policy, prompt, group) -> rollouts, for the traces' check
    traces: list[tuple[int, dict]] = []
    for i, line in enumerate(lines[1:], start=2):
        d = _parse(path, i, line)
        try:
            if not isinstance(d, dict):
                raise TypeError(f"expected a JSON object, got {type(d).__name__}")
            records.append(decode_record(d))
            problem = check_stored_record(d)
        except KeyError as e:
            raise StoredTrafficError(f"{path}:{i}: record is missing field {e.args[0]!r}") from e
        except (ValueError, TypeError, RuntimeError, struct.error) as e:
            raise StoredTrafficError(f"{path}:{i}: malformed record: {e}") from e
        if problem:
            raise StoredTrafficError(f"{path}:{i}: {record_name(d)}: {problem}")
        if d["kind"] == "rollout":
            key = (d["policy_id"], d["prompt_id"], d["group_id"])
            groups[key] = groups.get(key, 0) + 1
        elif d["kind"] == "trace":
            traces.append((i, d))
    if len(records) != header.get("num_records"):
        raise StoredTrafficError(
            f"{path}: header announces {header.get('num_records')!r} records but the file holds {len(records)} "
            f"(truncated or edited file)"
        )
    counts = Counter(record_kind(r) for r in records)
    if isinstance(header.get("counts"), dict) and header["counts"] != {k: counts.get(k, 0) for k in header["counts"]}:
        raise StoredTrafficError(f"{path}: header counts {header['counts']} but the file holds {dict(counts)} "
                                 f"(edited file)")
    for i, d in traces:
        n = groups.get((d["policy_id"], d["prompt_id"], d["group_id"]), 0)
        if d["index"] >= n:
            raise StoredTrafficError(
                f"{path}:{i}: {record_name(d)}: the trace is of response {d['index']}, but the file holds "
                f"{n} rollout records of that group: it belongs to no recorded response"
            )
    return StoredStep(path, step, header, tuple(records))


def _parse(path: Path, lineno: int, line: str):
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise StoredTrafficError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from e


# ------------------------------------------------------------------------------------------- cross-checks
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


# ------------------------------------------------------------------------------------------- ownership
def _resolved(p: str | os.PathLike) -> Path:
    return Path(os.path.realpath(os.path.expanduser(os.fspath(p))))


def check_store_not_replay(store_dir: str | os.PathLike | None, replay_dir: str | os.PathLike | None) -> None:
    """Raise ``ValueError`` when ``store_dir`` is ``replay_dir``, lies inside it or contains it (symlinks resolved):
    a replay run must never write where it reads."""
    if not store_dir or not replay_dir:
        return
    s, r = _resolved(store_dir), _resolved(replay_dir)
    if s == r:
        how = f"are the same folder ({s})" if os.fspath(store_dir) == os.fspath(replay_dir) else \
            f"are the same folder once symlinks are resolved ({s})"
    elif s.is_relative_to(r):
        how = f"overlap: store_dir ({s}) lies inside replay_dir ({r})"
    elif r.is_relative_to(s):
        how = f"overlap: replay_dir ({r}) lies inside store_dir ({s})"
    else:
        return
    outer = s if r.is_relative_to(s) and s != r else r
    raise ValueError(
        f"ExperienceExchange: store_dir {os.fspath(store_dir)!r} and replay_dir {os.fspath(replay_dir)!r} {how}. "
        f"A replay run would write its own step files over the recording it reads. Record the replay run into "
        f"another folder (e.g. store_dir: {outer.parent / (outer.name + '-replay')}), or drop store_dir."
    )


def step_run_ids(store_dir: str | os.PathLike) -> dict[int, str | None]:
    """``{step: run_id}`` of every step file in ``store_dir`` (from the header lines only; ``None`` for a file
    written before run ids or whose header cannot be read)."""
    out: dict[int, str | None] = {}
    for step in stored_steps(store_dir):
        try:
            with open(step_path(store_dir, step), encoding="utf-8") as fh:
                header = json.loads(fh.readline())
            out[step] = header.get("run_id") if isinstance(header, dict) else None
        except (OSError, ValueError):
            out[step] = None
    return out


def _span(steps: Sequence[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}..{steps[-1]} ({len(steps)} files)"


def check_store_owner(store_dir: str | os.PathLike, run_id: str, resumed: str | None) -> str | None:
    """Whether this run may record into ``store_dir``; raises :class:`StoreInUseError` when the folder holds
    another run's step files. Writes nothing.

    ``run_id``: this run's id (a resumed run's is its checkpoint's); ``resumed``: ``None`` (a new run), ``"run"``
    (resumed from a checkpoint that holds its run id) or ``"legacy"`` (from a checkpoint written before run ids).
    The folder is this run's when it has no step files, or when every step file carries ``run_id`` (files without
    a run id are allowed next to them: a recording adopted as below). A run resumed from a legacy checkpoint
    adopts a folder whose files all lack a run id (it cannot tell them from another run's; returns a note saying
    so). Returns ``None`` or that note."""
    ids = step_run_ids(store_dir)
    if not ids:
        return None
    owners = set(ids.values())
    if run_id in owners and owners <= {run_id, None}:
        return None
    steps = sorted(ids)
    if owners == {None} and resumed == "legacy":
        return (f"store_dir {store_dir}: its {_span(steps)} carry no run id (recorded before mutual-rl wrote "
                f"them), nor does the checkpoint this run resumes from; taken to be this run's recording")
    others = sorted(o for o in owners if o not in (None, run_id))
    who = (f"run {', '.join(others)}" if others else "a run that wrote no run id (recorded before mutual-rl "
           "wrote them), which cannot be told apart from another run")
    this = (f"this run (run {run_id}, resumed from its checkpoint)" if resumed == "run"
            else "this run (resumed from a checkpoint of another run)" if resumed == "legacy" else
            f"this new run (run {run_id})")
    raise StoreInUseError(
        f"store_dir {store_dir} already holds the recording of {who}: {_span(steps)}. Recording {this} there "
        f"would overwrite that run's steps. Record into a new folder (e.g. store_dir: "
        f"{Path(store_dir).parent / (Path(store_dir).name + '-2')}); to continue that run's recording, resume that "
        f"run from its own checkpoint (--ckpt_path <its last.ckpt>); if that recording is no longer needed, move "
        f"or delete the folder first."
    )


def set_aside_steps(store_dir: str | os.PathLike, from_step: int) -> tuple[Path, list[int]] | None:
    """Move the step files ``>= from_step`` of ``store_dir`` into a new sub-folder ``superseded-from-step-<s>``
    (``-2``, ``-3``, ... if taken): a resumed run's steps recorded after its checkpoint, which it records again.
    Returns ``(folder, steps)`` or ``None`` when there were none. Replay never reads sub-folders."""
    later = [s for s in stored_steps(store_dir) if s >= from_step]
    if not later:
        return None
    base = Path(store_dir) / f"superseded-from-step-{from_step:06d}"
    dest, k = base, 1
    while dest.exists():
        k += 1
        dest = base.with_name(f"{base.name}-{k}")
    dest.mkdir()
    for s in later:
        os.replace(step_path(store_dir, s), step_path(dest, s))
    fsync_dir(dest)
    fsync_dir(store_dir)
    return dest, later
