"""The preset cache's folders: where the cache root is, and building a folder once (atomic, under a lock).

Kept apart from :mod:`mutual_rl.presets.cache` so that the tokenizer conversion (``qwen_vocab``), which the
preset build calls, can cache its output without importing the preset cache.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from pathlib import Path

from mutual_rl.durable import disk_full_error


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` if given, else ``$MUTUAL_RL_CACHE``, else ``~/.cache/mutual_rl``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("MUTUAL_RL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "mutual_rl"


def build_once(path: Path, build) -> Path:
    """Make sure folder ``path`` exists, complete: if it has no ``done.json``, ``build(tmp)`` writes the contents
    into a temporary sibling folder, which then replaces ``path`` atomically; a file lock beside it makes parallel
    processes build it once. ``build`` may return a dict, stored in ``done.json``. A failed build leaves no
    temporary folder; a full disk is one ``OSError`` (ENOSPC) naming ``path``, the free space and that nothing
    was cached."""
    if not (path / "done.json").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.parent / f".{path.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (path / "done.json").exists():
                tmp = path.with_name(path.name + f".tmp{os.getpid()}")
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
                start = time.perf_counter()
                try:
                    info = build(tmp)
                    info = {**(info if isinstance(info, dict) else {}),
                            "seconds": round(time.perf_counter() - start, 1)}
                    (tmp / "done.json").write_text(json.dumps(info, indent=1, default=str))
                except BaseException as exc:
                    shutil.rmtree(tmp, ignore_errors=True)
                    full = disk_full_error(path, "the cached build of", exc, "nothing was cached (the partial "
                                           "build was removed), the next run builds it again")
                    if full is not None:
                        raise full from exc
                    raise
                shutil.rmtree(path, ignore_errors=True)
                os.replace(tmp, path)
    return path
