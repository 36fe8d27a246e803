"""Load prompt/benchmark files into :class:`~mutual_rl.data.task.Problem` records.

Formats (by extension, case-insensitive):

* ``.jsonl``: one JSON object per line (lines end at ``\n``; a trailing ``\r`` is ignored, and Unicode line
  separators such as U+2028 inside a value do not end a line); blank lines are skipped; rows are numbered by
  1-based line number. A line that is not valid JSON raises ``ValueError`` naming the file and the line.
* ``.json``: a JSON array of objects if the first non-blank character is ``[``, otherwise JSON lines as above;
  array rows are numbered 1-based.
* ``.parquet``: via ``pyarrow`` (optional: ``pip install pyarrow``); rows numbered 1-based. A file pyarrow cannot
  read as Parquet (not Parquet, truncated, corrupt) raises ``ValueError`` naming the file and pyarrow's reason.

JSON and JSONL files must be UTF-8 (a leading byte-order mark is allowed and dropped); bytes that are not UTF-8
raise ``ValueError`` naming the file, the line and the byte position in that line of the first bad byte. A string
holding a lone UTF-16 surrogate (JSON ``"\\ud800"`` without its pair: no character, so it cannot be encoded,
tokenized or logged) raises ``ValueError`` naming the file, the line (array row) and the field; a pair
(``"\\ud83d\\ude00"``) is the one character it encodes.

Each row must be an object with a non-empty string ``problem_key`` field and a non-empty ``answer_key`` field
(a string, or a finite number converted with ``str``; a float with an integer value such as ``46.0`` becomes
``"46"``; booleans, NaN and infinities are invalid); with ``skill_key`` set, that field must be present and
non-null too (converted with ``str``). With ``answer_regex``, the answer is the first group (the whole match if
the pattern has no group) of the pattern's first match (``re.search``) in that text, stripped: ``"####\\s*(.+)"``
turns GSM8K's ``"... #### 72"`` into ``"72"``; a row it does not match, or that leaves nothing, is invalid.
Anything else raises one ``ValueError`` naming the file, the row, the problem and the keys present.
``prompt_id = id_offset + i`` for the i-th loaded row (0-based, blank lines not counted). Every other field of the
row (all but ``problem_key`` and ``answer_key``) is kept, unchanged, in ``Problem.columns`` (what TRL-style rewards
get as keyword lists; :mod:`mutual_rl.rewards.trl_style`). The same row rules apply to Hugging Face datasets
(:mod:`mutual_rl.data.hf_datasets`).
"""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mutual_rl.types import Problem

SUPPORTED_EXTENSIONS = (".jsonl", ".json", ".parquet")


def _read_utf8(path: Path) -> str:
    """The file's text; the first non-UTF-8 byte raises ``ValueError`` with its 1-based line and column."""
    data = path.read_bytes()
    start = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[start:].decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = start + exc.start
        line = data.count(b"\n", 0, bad) + 1
        column = bad - (data.rfind(b"\n", 0, bad) + 1) + 1
        raise ValueError(
            f"{path}: line {line} is not valid UTF-8 (byte 0x{data[bad]:02x} at byte {column} of the line: "
            f"{exc.reason}); prompt files must be UTF-8: re-save it as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(value: Any, field: str = "") -> tuple[str, str, int] | None:
    """(field, the surrogate, its 1-based character position; 0 when it is in a key) of the first string in
    ``value`` (nested lists and objects too) that holds a lone UTF-16 surrogate; ``None`` if there is none."""
    if isinstance(value, str):
        m = _SURROGATE.search(value)
        return None if m is None else (field, m.group(), m.start() + 1)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        name = f"{field}[{key}]" if isinstance(key, int) else f"{field}.{key}" if field else key
        m = _SURROGATE.search(key) if isinstance(key, str) else None
        found = (name, m.group(), 0) if m is not None else _lone_surrogate(item, name)
        if found is not None:
            return found
    return None


def _checked_text(path: Path, where: str, row: Any, raw: str) -> Any:
    """``row`` unchanged; a lone surrogate in it raises ``ValueError`` naming the file, the row and the field. Only
    a ``\\u`` escape in the raw JSON can make one (the text itself is valid UTF-8), so rows without one cost a
    substring search."""
    if "\\u" in raw:
        found = _lone_surrogate(row)
        if found is not None:
            field, char, index = found
            at = f"at character {index}" if index else "in its name"
            raise ValueError(
                f"{path}: {where}: field {field!r} holds a lone UTF-16 surrogate {ascii(char)} ({at}), which "
                "is no character: it cannot be encoded as UTF-8, tokenized or logged. Fix the row: write the "
                "character itself, or a surrogate pair (e.g. \"\\ud83d\\ude00\" for U+1F600); drop a stray "
                "escape."
            )
    return row


def _iter_json(path: Path) -> Iterator[tuple[int, Any]]:
    text = _read_utf8(path)
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        for num, row in enumerate(rows, start=1):
            yield num, _checked_text(path, f"row {num}", row, text)
        return
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{path}: line {lineno} is not valid JSON ({exc.msg}); each line must be one JSON object"
            ) from None
        yield lineno, _checked_text(path, f"line {lineno}", row, line)


def _iter_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow") from None
    import pyarrow as pa

    try:
        rows = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(
            f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc}). Give a Parquet file (e.g. written "
            "by pandas DataFrame.to_parquet or pyarrow.parquet.write_table), or a .jsonl file with one JSON object "
            "per line; check that the file was copied completely."
        ) from None
    yield from enumerate(rows, start=1)


def _answer_text(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str) and value.strip():
        return value
    return None


def compile_answer_regex(pattern: str | re.Pattern | None) -> re.Pattern | None:
    """``pattern`` compiled (``None`` stays ``None``); an invalid pattern raises ``ValueError`` naming
    ``data.answer_regex``."""
    if pattern is None or isinstance(pattern, re.Pattern):
        return pattern
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"data.answer_regex {pattern!r} is not a valid regular expression ({exc}); give a Python "
                         "pattern whose first group is the answer, e.g. '####\\s*(.+)' for GSM8K") from None


def _extract(regex: re.Pattern, text: str) -> str | None:
    m = regex.search(text)
    if m is None:
        return None
    found = (m.group(1) if regex.groups else m.group(0)) or ""
    return found.strip() or None


def row_problem(
    row: Any, *, prompt_id: int, where: str, problem_key: str = "problem", answer_key: str = "answer",
    skill_key: str | None = None, answer_regex: str | re.Pattern | None = None,
) -> Problem:
    """One row (a dict) as a :class:`Problem` by the module docstring's rules; ``where`` (e.g. ``"data.jsonl: line
    3"``) starts every error message."""
    if not isinstance(row, dict):
        raise ValueError(f"{where} is a {type(row).__name__}, expected a JSON object")
    regex = compile_answer_regex(answer_regex)
    problem = row.get(problem_key)
    answer = _answer_text(row.get(answer_key))
    if answer is not None and regex is not None:
        extracted = _extract(regex, answer)
        if extracted is None:
            raise ValueError(f"{where}: data.answer_regex {regex.pattern!r} finds no answer in {answer_key!r} = "
                             f"{answer[:200]!r}; fix the row, or the pattern (its first group is the answer)")
        answer = extracted
    skill = row.get(skill_key) if skill_key is not None else ""
    for key, ok in (
        (problem_key, isinstance(problem, str) and problem.strip()),
        (answer_key, answer is not None),
        (skill_key, skill is not None),
    ):
        if not ok:
            state = "missing" if key not in row else f"empty or invalid ({row[key]!r})"
            raise ValueError(
                f"{where}: key {key!r} is {state}; keys present: {sorted(row)}. "
                f"Fix the row, or name the right column (problem_key=..., answer_key=..., skill_key=...)"
            )
    columns = {k: v for k, v in row.items() if k not in (problem_key, answer_key)}
    return Problem(prompt_id, problem, answer, str(skill), columns)


def load_problems(
    path: str | Path,
    problem_key: str = "problem",
    answer_key: str = "answer",
    skill_key: str | None = None,
    id_offset: int = 0,
    answer_regex: str | re.Pattern | None = None,
) -> list[Problem]:
    """Read ``path`` (JSONL / JSON / Parquet) into problems; see the module docstring for the exact rules."""
    path = Path(path)
    ext = path.suffix.lower()
    if ext not in SUPPORTED_EXTENSIONS:
        raise ValueError(
            f"{path}: unsupported extension {ext!r}; supported: {', '.join(SUPPORTED_EXTENSIONS)}"
        )
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    regex = compile_answer_regex(answer_regex)
    rows = _iter_parquet(path) if ext == ".parquet" else _iter_json(path)
    where = "row" if ext != ".jsonl" else "line"
    return [row_problem(row, prompt_id=id_offset + i, where=f"{path}: {where} {num}", problem_key=problem_key,
                        answer_key=answer_key, skill_key=skill_key, answer_regex=regex)
            for i, (num, row) in enumerate(rows)]
