"""How many CPU threads torch uses in this process (``model.num_threads``).

Each torch process runs as many intra-op threads as it thinks it has cores; two runs side by side on one machine
then run twice as many threads as cores, and each slows down far more than twice (measured here: two processes
on 2 cores, 0.54 s -> 10.4 s per step). Rule as implemented:

- ``num_threads`` given: exactly that many (``torch.set_num_threads``);
- ``None`` (default): torch's current setting, capped at the cores this process may run on
  (``os.sched_getaffinity``; a container's CPU limit shows there) divided by the processes of this run on the
  node (``LOCAL_WORLD_SIZE``, set by torchrun and Lightning's launchers), at least 1.

To run several jobs side by side, give each ``--model.num_threads`` = cores / jobs (``scripts/bench_threads.py``
measures it).
"""

from __future__ import annotations

import os

import torch


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity; ``os.cpu_count()`` where affinity is unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """``None``'s rule (module docstring)."""
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(1, min(torch.get_num_threads(), available_cores() // local))


def check_num_threads(num_threads: int | None) -> None:
    """``model.num_threads`` must be ``None`` or at least 1 (one error naming the setting otherwise)."""
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"model.num_threads must be >= 1 (got {num_threads}), or null for the default "
                         f"(at most the {available_cores()} cores this process may use).")


def configure_threads(num_threads: int | None) -> int:
    """Set torch's intra-op thread count by the rule above; returns the count now in force."""
    check_num_threads(num_threads)
    n = num_threads if num_threads is not None else default_threads()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
