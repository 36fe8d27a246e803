"""Durable file writes: the one helper the checkpoint writer and the exchange store share."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: Path | str) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


#: What torch's zip writer says when a write to its file fails (the errno is lost): a full disk, a quota.
_TORCH_WRITE_FAILURES = ("inline_container.cc", "PytorchStreamWriter failed writing", "file write failed")


def disk_full_error(path: Path | str, what: str, cause: BaseException, kept: str | None = None) -> OSError | None:
    """An ``OSError(ENOSPC)`` naming ``what``, ``path``, the free space of its filesystem and ``kept`` (what was
    saved, e.g. "the previous last.ckpt is intact"), when ``cause`` is a failed write because the disk (or a quota)
    is full; None for any other error.

    A full disk reaches the user as a bare ``[Errno 28] No space left on device`` with no path, or -- from
    ``torch.save`` -- as ``RuntimeError: [enforce fail at inline_container.cc:...] unexpected pos``, or -- from
    safetensors (``save_pretrained``) -- as a ``SafetensorError`` with ``os error 28``."""
    import errno
    import shutil

    full = isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT)
    if isinstance(cause, RuntimeError) and any(s in str(cause) for s in _TORCH_WRITE_FAILURES):
        full = True
    if not isinstance(cause, OSError) and ("No space left on device" in str(cause) or "os error 28" in str(cause)):
        full = True  # safetensors' SafetensorError ("I/O error: No space left on device (os error 28)")
    if not full:
        return None
    folder = Path(path).parent
    try:
        free = f"{shutil.disk_usage(folder).free / 2**20:.1f} MiB free there now"
    except OSError:
        free = "free space unknown"
    saved = f"; {kept}" if kept else ""
    return OSError(errno.ENOSPC, f"no space left on the device writing {what} {str(path)!r} ({free}){saved}: free "
                                 f"space on that filesystem or point the run at another folder")


def check_writable_dir(path: Path | str, what: str, fix: str) -> None:
    """Create ``path`` if needed and write (then remove) a file in it; any failure is one ``OSError`` naming
    ``what``, the path and ``fix`` -- before training, instead of after it when the file is finally written."""
    import tempfile

    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".mutual-rl-write-check.")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise type(exc)(exc.errno, f"{what} {str(path)!r} is not writable ({exc.strerror or exc}): {fix}") from exc


def check_output_dirs(log_dir: str | None, checkpoint_dir: str | None, export_root: Path | str) -> None:
    """The log folder, the checkpoint folder (when given) and the export folder are writable
    (:func:`check_writable_dir`, each naming the setting to change)."""
    if log_dir:
        check_writable_dir(log_dir, "the log folder",
                           "set trainer.default_root_dir (or the logger's save_dir) to a folder you can write")
    if checkpoint_dir:
        check_writable_dir(checkpoint_dir, "the checkpoint folder",
                           "set the ModelCheckpoint's dirpath (or trainer.default_root_dir) to a folder you can write")
    check_writable_dir(export_root, "the export folder (model.export_dir)",
                       "set model.export_dir to a folder you can write (default: <log_dir>/export)")
