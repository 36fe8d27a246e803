"""On-disk exchange traffic: one schema-versioned JSONL file per training step, written atomically.

File ``<store_dir>/step-<step:06d>.jsonl``:

* line 1, the header: ``{"format": "mutual_rl.exchange", "schema_version": 1, "step": s, "record_kinds": [...],
  "policies": [...], "num_records": N, "counts": {kind: count}, "flows": {...}}`` (``flows`` is the step's
  accounting, informational only);
* lines 2..N+1, one record each: ``{"kind": "rollout" | "reward" | "advantage" | "trace", <fields>}``. Tensors are
  ``{"dtype": "float32", "shape": [T], "data": [...]}``; floats are written with Python's shortest round-trip
  ``repr`` (JSON numbers; ``NaN``/``Infinity`` as Python's ``json`` writes them), which represents every
  float16/bfloat16/float32/float64 value exactly, so log-probs, rewards and advantages read back bit-identical.

Writes go to a temporary file in the same directory, are flushed and fsync'ed, then ``os.replace``'d onto the
final name (and the directory is fsync'ed), so a reader sees a whole step or none. Reading validates everything
and raises :class:`StoredTrafficError` naming the file (and the line) for a missing step, an unknown schema
version, invalid JSON (e.g. a line truncated mid-way), a missing final newline, a missing field, or a record
count that disagrees with the header -- never a silent partial step.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields
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
    """A stored exchange file is missing, of another schema version, truncated or corrupt."""


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
    """A JSON-ready dict of one record (``{"kind": ..., <fields>}``)."""
    out = {"kind": record_kind(record)}
    for f in fields(record):
        v = getattr(record, f.name)
        if isinstance(v, torch.Tensor):
            v = _encode_tensor(v)
        elif f.name == "offsets":
            v = [list(span) for span in v]
        out[f.name] = v
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
def write_step(store_dir: str | os.PathLike, step: int, records: Sequence[Record], flows: dict | None = None) -> Path:
    """Atomically write one step's records to ``step-<step>.jsonl``; returns the final path."""
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
    for i, line in enumerate(lines[1:], start=2):
        d = _parse(path, i, line)
        try:
            if not isinstance(d, dict):
                raise TypeError(f"expected a JSON object, got {type(d).__name__}")
            records.append(decode_record(d))
        except KeyError as e:
            raise StoredTrafficError(f"{path}:{i}: record is missing field {e.args[0]!r}") from e
        except (ValueError, TypeError, RuntimeError) as e:
            raise StoredTrafficError(f"{path}:{i}: malformed record: {e}") from e
    if len(records) != header.get("num_records"):
        raise StoredTrafficError(
            f"{path}: header announces {header.get('num_records')!r} records but the file holds {len(records)} "
            f"(truncated or edited file)"
        )
    return StoredStep(path, step, header, tuple(records))


def _parse(path: Path, lineno: int, line: str):
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise StoredTrafficError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from e
