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

from mutual_rl.durable import fsync_dir

# Special values of ``--ckpt_path`` that Lightning resolves itself.
_SPECIAL_CKPT_PATHS = ("last", "best", "hpc")


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` so that ``path`` holds either its previous content or all of the new one.

    Writes ``.<name>.<random>.tmp`` next to ``path``, fsyncs it, ``os.replace``\\ s it onto ``path`` and fsyncs the
    directory; on any error the temporary file is removed and the error re-raised. The file gets the usual
    ``0o666 & ~umask`` permissions.
    """
    path = Path(path).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
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
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)




def is_special_ckpt_path(path: str | os.PathLike) -> bool:
    """A ``ckpt_path`` Lightning resolves itself (``last``, ``best``, ``hpc``, ``registry...``) or a URL."""
    text = str(path)
    return text in _SPECIAL_CKPT_PATHS or text.startswith("registry") or "://" in text


def verify_checkpoint_file(path: str | os.PathLike) -> None:
    """Raise a clear error, naming ``path``, unless it exists and is a complete ``torch.save`` archive.

    A directory passes (a sharded FSDP checkpoint is one). A file passes when it is a zip archive (torch's format)
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
        return
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


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with atomic, fsynced local saves (:func:`atomic_torch_save`) and checked loads.

    ``save_checkpoint``: local paths via :func:`atomic_torch_save`; other filesystems (``s3://`` ...) as
    Lightning's ``TorchCheckpointIO`` does. ``load_checkpoint``: a local path is first checked with
    :func:`verify_checkpoint_file` (missing path, random bytes, truncated file: one error naming the path).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or not _is_local_path(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        atomic_torch_save(checkpoint, path)

    def load_checkpoint(self, path, map_location=lambda storage, loc: storage, weights_only: bool | None = None):
        if _is_local_path(path):
            verify_checkpoint_file(path)
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)


def _is_local_path(path) -> bool:
    """A plain local path (no ``scheme://``, not even ``file://``: those go through fsspec as Lightning does)."""
    return "://" not in str(path) and isinstance(get_filesystem(path), LocalFileSystem)
