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
final name (and the directory is fsync'ed), so a reader sees a whole step or none; a full disk is one ``OSError``
(ENOSPC) naming the file, the free space and the steps stored so far. Reading validates everything
and raises :class:`StoredTrafficError` naming the file (and the line) for a missing step, an unknown schema
version, invalid JSON (e.g. a line truncated mid-way), a missing final newline, a missing field, or a record
count that disagrees with the header -- never a silent partial step. Every record is also cross-checked
(:func:`~mutual_rl.exchange.checks.check_stored_record`; the error names the file, the line and the record's policy, prompt and group): one
log-prob and one character span per response token, spans in order inside the response text and ending at its
end, token ids that are integers >= 0, log-probs and traces finite and <= 0, rewards and advantages finite, a
known finish reason, the rollout's digest; a trace must belong to a response of the file.

Ownership: a store folder holds one run's recording. :func:`check_store_owner` refuses a folder whose step files
were written by another run (their headers' ``run_id``), so a second run never overwrites a first one's steps;
the same run resumed from its checkpoint (which holds its run id) keeps recording, and
:func:`set_aside_steps` moves the steps it recorded after that checkpoint into a ``superseded-from-step-<s>``
sub-folder (kept, never replayed) before it records them again. :func:`check_store_not_replay` refuses a
``store_dir`` that is, contains or lies inside the ``replay_dir`` being read. Two runs at once on one folder are
kept apart by an OS lock (``lock.py``), taken by the recording callback for the whole fit.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from mutual_rl.durable import disk_full_error, fsync_dir
from mutual_rl.exchange.checks import check_stored_record, record_name, rollout_digest
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
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        full = disk_full_error(path, f"the exchange traffic of step {step} to", exc, _kept(store_dir, step))
        if full is not None:
            raise full from exc
        raise
    fsync_dir(path.parent)
    return path


def _kept(store_dir: str | os.PathLike, step: int) -> str:
    """What a failed write of ``step`` left in ``store_dir``, in words."""
    have = [s for s in stored_steps(store_dir) if s != step]
    kept = f"the recording there keeps {_span(have)}" if have else "no step of the recording is stored there yet"
    return f"{kept}, step {step} was not written (no partial file left)"




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
    header = _header(path, lines[0], expected_step)
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
    return StoredStep(path, header.get("step"), header, tuple(records))


def _header(path: Path, line: str, expected_step: int | None) -> dict:
    """A step file's header line, checked: format, schema version, and the step its name says."""
    header = _parse(path, 1, line)
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
    return header


def _parse(path: Path, lineno: int, line: str):
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise StoredTrafficError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from e


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
