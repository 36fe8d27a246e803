"""Hugging Face ``datasets`` as prompt sources: :class:`HFDataset` (``data.train_dataset`` / ``data.val_dataset``).

``path`` says where the rows come from, checked in this order:

* a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk`` (it holds ``state.json`` or
  ``dataset_dict.json``): read with ``datasets.load_from_disk``. A ``DatasetDict`` needs ``split`` unless it holds
  one split; a single ``Dataset`` is used whole, and a given ``split`` must be the one it was saved from when it
  recorded one (``Dataset.split``);
* a data file ending in ``.json``, ``.jsonl``, ``.csv`` or ``.parquet``: read with
  ``datasets.load_dataset("json" | "csv" | "parquet", data_files=path, split=split or "train")`` -- its rows are
  the split ``train`` (``split`` may slice it, e.g. ``train[:1000]``); ``name`` and ``revision`` do not apply;
* anything else -- a Hub name such as ``openai/gsm8k``, or a local folder of data files -- goes to
  ``datasets.load_dataset(path, name, split=split, revision=revision)``; a path that looks local (it starts with
  ``/``, ``.`` or ``~``, or ends in a data-file suffix) and does not exist is a ``FileNotFoundError``.

Each row becomes a :class:`~mutual_rl.data.task.Problem` by the rules of :mod:`mutual_rl.data.files` (the same
column mapping ``data.problem_key`` / ``data.answer_key`` / ``data.skill_key``, the same conversion of answers that
are not strings, the same ``data.answer_regex``); every other column goes, unchanged, into ``Problem.columns``.
A mapped column the dataset lacks is one ``ValueError`` naming the source, the column and the columns present.

``datasets`` is optional: ``pip install datasets`` (the error says so when it is missing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from mutual_rl.data.files import compile_answer_regex, row_problem
from mutual_rl.types import Problem

BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
"""Data-file suffix -> the ``datasets`` builder that reads it."""


@dataclass
class HFDataset:
    """A Hugging Face datasets source: a save_to_disk folder, a data file, or a Hub dataset (module docstring)."""

    path: str
    """save_to_disk folder, data file (.json/.jsonl/.csv/.parquet), or Hub name such as openai/gsm8k."""
    split: str | None = None
    """Split to read, e.g. train (Hub names and data files also take slices such as test[:500]; a save_to_disk
    folder takes whole split names only); may be left out when the source holds a single split."""
    name: str | None = None
    """Configuration of a Hub dataset that has several (e.g. main for openai/gsm8k)."""
    revision: str | None = None
    """Hub revision to pin: a branch, tag or commit."""

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path.strip():
            raise ValueError(f"HFDataset.path must be a non-empty string (got {self.path!r}): a save_to_disk "
                             "folder, a .json/.jsonl/.csv/.parquet file, or a Hub name such as openai/gsm8k.")

    def describe(self) -> str:
        """``'openai/gsm8k' (name 'main', split 'train')``: how messages name this source."""
        extra = [f"{k} {v!r}" for k, v in (("name", self.name), ("split", self.split), ("revision", self.revision))
                 if v is not None]
        return repr(self.path) + (f" ({', '.join(extra)})" if extra else "")


def as_hf_dataset(source: HFDataset | dict | str) -> HFDataset:
    """``source`` as an :class:`HFDataset` (a dict of its fields, or a bare path, are accepted)."""
    if isinstance(source, HFDataset):
        return source
    if isinstance(source, str):
        return HFDataset(source)
    if isinstance(source, dict):
        return HFDataset(**source)
    raise TypeError(f"expected an HFDataset, a dict of its fields or a path, got {type(source).__name__}")


def _datasets(label: str, source: HFDataset):
    try:
        import datasets
    except ImportError:
        raise ImportError(f"{label} {source.describe()} needs the Hugging Face datasets library: "
                          "pip install datasets") from None
    return datasets


def _looks_local(path: str) -> bool:
    return path.startswith(("/", ".", "~")) or Path(path).suffix.lower() in BUILDERS


def _pick_split(obj: Any, source: HFDataset, label: str):
    """The ``datasets.Dataset`` of ``source.split`` from a ``DatasetDict`` (or ``obj`` itself)."""
    if not hasattr(obj, "keys"):  # a single Dataset
        recorded = getattr(obj, "split", None)
        if source.split is not None and recorded is not None and str(recorded) != source.split:
            raise ValueError(f"{label} {source.describe()}: the saved dataset is split {str(recorded)!r}, not "
                             f"{source.split!r}; set split: {str(recorded)} or leave split out.")
        return obj
    splits = sorted(obj.keys())
    if source.split is None:
        if len(splits) == 1:
            return obj[splits[0]]
        raise ValueError(f"{label} {source.describe()} has the splits {splits}: choose one with split: "
                         f"(e.g. split: {splits[0]}).")
    if source.split not in obj:
        raise ValueError(f"{label} {source.describe()} has no split {source.split!r}; its splits: {splits}.")
    return obj[source.split]


def open_dataset(source: HFDataset, label: str = "data.train_dataset"):
    """The ``datasets.Dataset`` that ``source`` names (module docstring); ``label`` names it in errors."""
    datasets = _datasets(label, source)
    path = Path(source.path).expanduser()
    if path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
        what, call = "saved folder", partial(datasets.load_from_disk, str(path))
        fix = "give the folder written by Dataset.save_to_disk / DatasetDict.save_to_disk"
    elif path.suffix.lower() in BUILDERS and path.is_file():
        given = [k for k in ("name", "revision") if getattr(source, k) is not None]
        if given:
            raise ValueError(f"{label} {source.describe()}: {' and '.join(given)} apply to Hub datasets only, not "
                             f"to a data file; leave {' and '.join(given)} out.")
        builder = BUILDERS[path.suffix.lower()]
        what = f"data file (datasets builder {builder!r})"
        call = partial(datasets.load_dataset, builder, data_files=str(path), split=source.split or "train")
        fix = "a data file's rows are the split 'train' (or a slice of it such as train[:100]); check the file"
    elif _looks_local(source.path) and not path.exists():
        raise FileNotFoundError(f"{label}: {source.path!r} does not exist (a save_to_disk folder or a data file "
                                f"{'/'.join(BUILDERS)} was expected; a Hub name looks like owner/name).")
    else:
        what = "local folder" if path.is_dir() else "Hub dataset"
        call = partial(datasets.load_dataset, source.path, source.name, split=source.split, revision=source.revision)
        fix = ("check path, name (the configuration), split and revision, and that the Hub is reachable "
               "(with HF_HUB_OFFLINE=1 only cached datasets load); or save it once with save_to_disk and give that "
               "folder")
    try:
        loaded = call()
    except Exception as exc:  # noqa: BLE001 - one message naming the source and the fix
        raise ValueError(f"{label}: cannot load {what} {source.describe()} ({type(exc).__name__}: {exc}); "
                         f"{fix}.") from exc
    return _pick_split(loaded, source, label)


def load_dataset_problems(
    source: HFDataset | dict | str, *, problem_key: str = "problem", answer_key: str = "answer",
    skill_key: str | None = None, id_offset: int = 0, answer_regex: str | re.Pattern | None = None,
    label: str = "data.train_dataset",
) -> list[Problem]:
    """The rows of ``source`` as problems, ``prompt_id = id_offset + i`` for the i-th row (module docstring)."""
    source = as_hf_dataset(source)
    regex = compile_answer_regex(answer_regex)
    ds = open_dataset(source, label)
    present = list(ds.column_names)
    for option, key in (("problem_key", problem_key), ("answer_key", answer_key), ("skill_key", skill_key)):
        if key is not None and key not in present:
            raise ValueError(f"{label} {source.describe()} has no column {key!r} (data.{option}); columns "
                             f"present: {present}. Name the right column with data.{option}.")
    where = f"{label} {source.describe()}: row"
    return [row_problem(row, prompt_id=id_offset + i, where=f"{where} {i + 1}", problem_key=problem_key,
                        answer_key=answer_key, skill_key=skill_key, answer_regex=regex)
            for i, row in enumerate(ds)]
