"""Checkpoint files: atomic, durable writes and a clear error for a file that is not a checkpoint.

Lightning 2.6's ``TorchCheckpointIO`` serialises into memory, writes the bytes to a temporary file made by
``tempfile.mkstemp()`` in the *system* temp directory and ``shutil.move``\\ s it onto the final name, without
``fsync``. When the system temp directory is on another filesystem than the checkpoints (a tmpfs ``/tmp``, a
network or scratch disk for runs) the move is a copy straight into the final file: a full disk or a crash
mid-copy leaves a truncated ``last.ckpt`` where the previous good one was. And without ``fsync`` a power loss
after the rename can leave an empty file.

:class:`AtomicCheckpointIO` writes every local checkpoint to a hidden temporary file in the checkpoint's own
directory, ``fsync``\\ s it, ``os.replace``\\ s it onto the final name (atomic on one filesystem) and ``fsync``\\ s
the directory. Any failure removes the temporary file and leaves the previous file under the final name as it
was. ``mutual-rl`` uses it by default (``mutual_rl.cli``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO

from mutual_rl.durable import disk_full_error, fsync_dir

# Special values of ``--ckpt_path`` that Lightning resolves itself.
_SPECIAL_CKPT_PATHS = ("last", "best", "hpc")


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` so that ``path`` holds either its previous content or all of the new one.

    Writes ``.<name>.<random>.tmp`` next to ``path``, fsyncs it, ``os.replace``\\ s it onto ``path`` and fsyncs the
    directory; on any error the temporary file is removed and the error re-raised (a full disk as one ``OSError``
    naming ``path``, the free space and that the previous file is intact: :func:`~mutual_rl.durable.disk_full_error`).
    The file gets the usual ``0o666 & ~umask`` permissions.
    """
    path = Path(path).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = path.exists()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        kept = (f"the previous {path.name} is intact" if existed else
                f"no {path.name} was written (no partial file left)")
        full = disk_full_error(path, "the checkpoint", exc, kept)
        if full is not None:
            raise full from exc
        raise
    fsync_dir(path.parent)




def is_special_ckpt_path(path: str | os.PathLike) -> bool:
    """A ``ckpt_path`` Lightning resolves itself (``last``, ``best``, ``hpc``, ``registry...``) or a remote
    filesystem URL (``s3://``, ``gs://``, ... through fsspec; ``http(s)://`` is refused: :func:`refuse_web_url`)."""
    text = str(path)
    return text in _SPECIAL_CKPT_PATHS or text.startswith("registry") or "://" in text


#: URL schemes a checkpoint is never loaded from (:func:`refuse_web_url`).
WEB_SCHEMES = ("http://", "https://", "ftp://")


def refuse_web_url(path: str | os.PathLike) -> None:
    """Raise ``ValueError`` if ``path`` is an ``http(s)://`` or ``ftp://`` URL.

    A checkpoint is a pickle. Lightning loads web URLs with ``weights_only=False`` (``torch.hub``), so a checkpoint
    served over http ran its payload where the same file as a local path is refused by torch's safe loader.
    mutual-rl loads checkpoints from files (and fsspec filesystems such as ``s3://``), always with
    ``weights_only=True``; a web URL is downloaded by the user first."""
    text = str(path)
    if text.lower().startswith(WEB_SCHEMES):
        raise ValueError(
            f"ckpt_path {text!r} is a web URL: mutual-rl does not load checkpoints over http(s)/ftp (a checkpoint is "
            "a pickle, and Lightning would unpickle a downloaded one without torch's weights_only safety). Download "
            "it first (e.g. `curl -L -o resume.ckpt URL`) and pass the local file: it is then checked and loaded "
            "with weights_only=True."
        )


def _looks_sharded(directory: Path) -> bool:
    """A sharded (FSDP / distributed checkpoint) folder: it holds ``meta.pt`` or ``.metadata``."""
    return (directory / "meta.pt").is_file() or (directory / ".metadata").is_file()


def verify_checkpoint_file(path: str | os.PathLike) -> None:
    """Raise a clear error, naming ``path``, unless it exists and is a complete ``torch.save`` archive.

    A directory passes only if it is a sharded checkpoint (``meta.pt`` or ``.metadata`` in it); any other directory
    is an error listing the ``.ckpt`` files in it (``runs/x/checkpoints`` instead of ``.../last.ckpt``). A file passes when it is a zip archive (torch's format)
    whose central directory is intact and which holds a ``data.pkl`` record: random bytes, a truncated file and
    other zip files fail here instead of deep inside ``torch.load``.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(
            f"checkpoint {str(path)!r} does not exist: give the path of a checkpoint written by mutual-rl fit "
            "(e.g. <log_dir>/checkpoints/last.ckpt), or omit ckpt_path to start from scratch."
        )
    if p.is_dir():
        if _looks_sharded(p):
            return
        found = sorted(p.rglob("*.ckpt"), key=lambda f: f.stat().st_mtime, reverse=True)[:5]
        hint = (f" It holds {', '.join(repr(str(f)) for f in found)} (newest first): pass one of those files."
                if found else " It holds no .ckpt file.")
        raise IsADirectoryError(
            f"checkpoint {str(path)!r} is a directory, not a checkpoint file.{hint} A run's checkpoints are "
            "<log_dir>/checkpoints/*.ckpt; `--ckpt_path last` picks the newest last.ckpt of the run."
        )
    problem = None
    if not zipfile.is_zipfile(p):
        problem = "it is not a complete torch.save archive (random bytes, or truncated by a failed write or copy)"
    else:
        try:
            with zipfile.ZipFile(p) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, OSError) as e:
            problem = f"its archive cannot be read ({e})"
        else:
            if not any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
                problem = "it is a zip archive but not one written by torch.save"
    if problem is not None:
        raise ValueError(
            f"checkpoint {str(path)!r} is not a valid mutual-rl checkpoint: {problem}. Give the path of a "
            "checkpoint written by mutual-rl fit (e.g. <log_dir>/checkpoints/last.ckpt)."
        )


class CheckpointRefusedError(ValueError):
    """A checkpoint holds Python objects that torch's safe loader (``weights_only=True``) does not load."""


def refused_pickle(path, exc: BaseException) -> CheckpointRefusedError:
    """One error naming ``path`` and the object torch's safe loader refused (torch's own message suggests loading
    the file unsafely; this one does not)."""
    import re

    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc)) or re.search(
        r"WeightsUnpickler error: ([^\n]+?)(?:\.|\n|$)", str(exc))
    what = f"a Python object ({found.group(1)})" if found else "Python objects"
    return CheckpointRefusedError(
        f"checkpoint {str(path)!r} was refused: it holds {what} that loading would have to run, and mutual-rl loads "
        "checkpoints with torch's safe loader only, so that no code in a checkpoint runs. A checkpoint written by "
        "mutual-rl fit holds only tensors and plain values: this file was written by other code or altered. Resume "
        "from a checkpoint of your own run (e.g. <log_dir>/checkpoints/last.ckpt), or start without --ckpt_path.")


def safe_torch_load(path, **kwargs):
    """``torch.load(path, weights_only=True, **kwargs)``; a refused pickle is :class:`CheckpointRefusedError`
    naming ``path`` (:func:`refused_pickle`), raised without torch's message."""
    import pickle

    try:
        return torch.load(path, weights_only=True, **kwargs)
    except pickle.UnpicklingError as exc:
        error = exc
    raise refused_pickle(path, error) from None


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with atomic, fsynced local saves (:func:`atomic_torch_save`) and checked loads.

    ``save_checkpoint``: local paths via :func:`atomic_torch_save`; other filesystems (``s3://`` ...) as
    Lightning's ``TorchCheckpointIO`` does. ``load_checkpoint``: a local path is first checked with
    :func:`verify_checkpoint_file` (missing path, random bytes, truncated file: one error naming the path); web URLs
    are refused (:func:`refuse_web_url`) and every load is ``weights_only=True`` unless the caller passes ``False``;
    a pickle payload it refuses is :class:`CheckpointRefusedError` naming the path (:func:`refused_pickle`).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or not _is_local_path(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        atomic_torch_save(checkpoint, path)

    def load_checkpoint(self, path, map_location=lambda storage, loc: storage, weights_only: bool | None = None):
        refuse_web_url(path)
        if _is_local_path(path):
            verify_checkpoint_file(path)
        if weights_only is None:  # Lightning's None means weights_only=False for URLs; a caller's False stays False
            weights_only = True
        import pickle

        try:
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except pickle.UnpicklingError as exc:
            if not weights_only:
                raise
            error = exc
        raise refused_pickle(path, error) from None


def _is_local_path(path) -> bool:
    """A plain local path (no ``scheme://``, not even ``file://``: those go through fsspec as Lightning does)."""
    return "://" not in str(path) and isinstance(get_filesystem(path), LocalFileSystem)


def checkpoint_hyper_parameter_keys(path: str | os.PathLike) -> list[str]:
    """The keys of ``path``'s ``hyper_parameters`` entry (Lightning's ``save_hyperparameters``), [] if none.

    Read with ``weights_only=True`` and ``mmap=True``: nothing in the file runs, and tensors are not read; a refused
    pickle is :class:`CheckpointRefusedError`."""
    ckpt = safe_torch_load(path, map_location="cpu", mmap=True)
    hparams = ckpt.get("hyper_parameters") if isinstance(ckpt, dict) else None
    return sorted(str(k) for k in hparams) if isinstance(hparams, dict) else []


def _arg(obj, key: str, default=None):
    """``obj.get(key)`` for a dict or jsonargparse Namespace, ``getattr`` otherwise; ``default`` if absent or None."""
    get = getattr(obj, "get", None)
    value = get(key) if callable(get) else getattr(obj, key, None)
    return default if value is None else value


def last_checkpoint_patterns(trainer_cfg) -> list[str]:
    """Where a run configured by ``trainer_cfg`` (the parsed ``trainer`` section) writes ``last.ckpt``, as glob
    patterns: each ``ModelCheckpoint``'s ``dirpath``; else ``<save_dir>/<name>/*/checkpoints`` for each logger with
    a ``save_dir`` (every version folder of the run), ``<default_root_dir>/lightning_logs/*/checkpoints`` for
    Lightning's default logger, and ``<default_root_dir>/checkpoints`` without a logger."""
    root = Path(str(_arg(trainer_cfg, "default_root_dir", "") or "."))
    dirs = []
    for cb in _arg(trainer_cfg, "callbacks", None) or []:
        if str(_arg(cb, "class_path", type(cb).__name__)).endswith("ModelCheckpoint"):
            dirpath = _arg(_arg(cb, "init_args", None) or {}, "dirpath", None) or getattr(cb, "dirpath", None)
            if dirpath:
                dirs.append(Path(str(dirpath)))
    if not dirs:
        logger = _arg(trainer_cfg, "logger", None)
        loggers = logger if isinstance(logger, list) else [logger]
        for lg in loggers:
            if lg is None or lg is True:
                dirs.append(root / "lightning_logs" / "*" / "checkpoints")
            elif lg is False:
                dirs.append(root / "checkpoints")
            else:
                init = _arg(lg, "init_args", None) or {}
                save_dir = _arg(init, "save_dir", None) or root
                dirs.append(Path(str(save_dir)) / str(_arg(init, "name", "lightning_logs")) / "*" / "checkpoints")
                break  # Lightning puts checkpoints under the first logger's folder
    return [str(d / "last*.ckpt") for d in dirs]


def find_last_checkpoint(trainer_cfg) -> Path:
    """The newest (by modification time) ``last*.ckpt`` of the run configured by ``trainer_cfg``
    (:func:`last_checkpoint_patterns`), or ``FileNotFoundError`` naming where it looked.

    Lightning's own ``ckpt_path="last"`` looks only in the checkpoint folder of the run being started -- a new
    version folder, empty -- so it never finds the previous run's ``last.ckpt`` and starts from scratch."""
    import glob

    patterns = last_checkpoint_patterns(trainer_cfg)
    found = [Path(f) for pattern in patterns for f in glob.glob(pattern)]
    found = [f for f in found if f.is_file()]
    if not found:
        raise FileNotFoundError(
            f"--ckpt_path last: no last.ckpt of this run was found (looked for {', '.join(patterns)}). Give the "
            "checkpoint's path with --ckpt_path <file>, or leave --ckpt_path out to start from scratch; a run "
            "writes last.ckpt with a ModelCheckpoint(save_last=True) callback, and when stopped by SIGTERM."
        )
    return max(found, key=lambda f: f.stat().st_mtime)
