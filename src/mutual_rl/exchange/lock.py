"""An OS file lock on an exchange store folder: one recording run at a time (:class:`StoreLock`).

A recording run holds ``<store_dir>/.mutual-rl.lock`` with ``fcntl.flock(LOCK_EX)`` from its fit's set-up to its
end (released at teardown or on an exception; the OS releases it when the process dies, ``kill -9`` included).
The file holds one JSON line naming the holder: ``{"pid", "host", "started", "command"}`` (``command``:
``shlex.join(sys.orig_argv)``).

* A second run on the same folder cannot take the lock: :meth:`StoreLock.acquire` raises
  :class:`~mutual_rl.exchange.store.StoreInUseError` naming the holder's pid, host, start time and command.
* A run that ends cleanly removes the file (only while it still holds that very file: its inode is checked). A
  file left by a process that died without releasing it is *stale*: the lock itself is free (the OS dropped it),
  so the next run takes it over and :meth:`StoreLock.acquire` returns a one-line note naming the dead holder.
* :func:`check_not_being_recorded` refuses a ``replay_dir`` whose lock is held right now (a recording still being
  written), naming the holder the same way; it takes a shared lock for an instant and never writes.

``flock`` locks are per open file: two locks on one folder conflict even within one process. On a network file
system without ``flock`` support, the lock does not protect across hosts (the holder's host is in the file).
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path

from mutual_rl.exchange.store import StoreInUseError

LOCK_NAME = ".mutual-rl.lock"
_TRIES, _PAUSE_S = 5, 0.1  # a concurrent starter writes its line, or a replay's probe ends, within this


def lock_path(folder: str | os.PathLike) -> Path:
    return Path(folder) / LOCK_NAME


def _holder_text(info: dict) -> str:
    """``pid P on host H, started T, command: C`` from a lock file's line (what is known of it)."""
    if not info:
        return "a process that has not written its name yet"
    parts = [f"pid {info.get('pid', '?')}"]
    if info.get("host") and info["host"] != socket.gethostname():
        parts.append(f"on host {info['host']}")
    if info.get("started"):
        parts.append(f"started {info['started']}")
    return ", ".join(parts) + f", command: {info.get('command', '?')}"


def _read_info(fd: int) -> dict:
    try:
        raw = os.pread(fd, 65536, 0).decode("utf-8", "replace").strip()
        info = json.loads(raw) if raw else {}
    except (OSError, ValueError):
        return {"command": "(unreadable lock file)"}
    return info if isinstance(info, dict) else {"command": "(unreadable lock file)"}


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


class StoreLock:
    """The lock of one store folder, for a recording run (module docstring)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.path = lock_path(folder)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> str | None:
        """Take the lock (creating the folder), or raise :class:`StoreInUseError` naming its holder. Returns a
        one-line note when a stale lock of a dead process was taken over, else ``None``."""
        if self._fd is not None:
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        info: dict = {}
        for _ in range(_TRIES):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                info = _read_info(fd)
                os.close(fd)
                time.sleep(_PAUSE_S)
                continue
            if not _same_file(fd, self.path):  # its holder removed it while we opened it: take the new one
                os.close(fd)
                continue
            previous = _read_info(fd)
            self._write(fd)
            self._fd = fd
            return self._stale_note(previous)
        raise StoreInUseError(
            f"store_dir {self.folder} is being recorded right now by another run: {_holder_text(info)} (lock file "
            f"{self.path}). Two runs recording into one folder would mix their steps. Record this run into another "
            f"folder (e.g. store_dir: {self.folder.parent / (self.folder.name + '-2')}), or start it after that run "
            f"has ended.")

    @staticmethod
    def _write(fd: int) -> None:
        line = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                           "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                           "command": shlex.join(getattr(sys, "orig_argv", sys.argv))})
        os.ftruncate(fd, 0)
        os.pwrite(fd, (line + "\n").encode("utf-8"), 0)
        os.fsync(fd)

    def _stale_note(self, previous: dict) -> str | None:
        if not previous or previous.get("pid") == os.getpid():
            return None
        state = ("which no longer holds it" if _pid_alive(previous.get("pid")) and
                 previous.get("host") in (None, socket.gethostname()) else "which is no longer running")
        return (f"store_dir {self.folder}: took over the stale lock left by {_holder_text(previous)}, {state} "
                f"(it ended without releasing it, e.g. killed)")

    def release(self) -> None:
        """Remove the lock file (if it is still ours) and release the lock; a no-op when not held."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if _same_file(fd, self.path):
                self.path.unlink()
        except OSError:
            pass
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def check_not_being_recorded(folder: str | os.PathLike) -> None:
    """Raise :class:`StoreInUseError` when a run holds ``folder``'s lock right now (it is still recording there);
    a folder without a lock file, or with a stale one, passes. Writes nothing."""
    path = lock_path(folder)
    info: dict = {}
    for _ in range(_TRIES):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            info = _read_info(fd)
            time.sleep(_PAUSE_S)
            continue
        finally:
            os.close(fd)  # closing the file releases a shared lock taken on it
        return
    raise StoreInUseError(
        f"replay_dir {folder} is being recorded right now by another run: {_holder_text(info)} (lock file {path}). "
        f"Its steps are still being written, so a replay would read an unfinished recording. Replay it after that "
        f"run has ended.")


__all__ = ["LOCK_NAME", "StoreLock", "check_not_being_recorded", "lock_path"]
