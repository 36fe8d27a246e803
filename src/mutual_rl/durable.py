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
