"""Shared by the memory benchmarks (``bench_lora_memory.py``, ``bench_logits_memory.py``): the peak memory of a block
of work, and variants run alternately in fresh subprocesses.

* :class:`PeakMemory` -- the peak during the ``with`` block minus the memory just before it: CPU resident set size
  sampled every 0.2 ms by a thread (psutil), and on CUDA ``torch.cuda.max_memory_allocated`` minus
  ``memory_allocated`` before the block.
* :func:`run_variants` -- each variant in a fresh child process (clean allocator state and peak counters), in the
  order A B, B A, A B, ... with glibc's ``MALLOC_MMAP_THRESHOLD_=65536`` (fixed, not dynamic), so freed tensors go
  back to the OS and RSS tracks live memory instead of allocator caching. A child prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time


class PeakMemory:
    """``with PeakMemory(device) as m: ...`` then ``m.rss_delta_mib`` (and ``m.cuda_delta_mib`` on CUDA)."""

    def __init__(self, device):
        self.device = device
        self.rss_delta_mib = 0.0
        self.cuda_delta_mib = None

    def __enter__(self):
        import psutil
        import torch

        self._proc = psutil.Process()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self._cuda_base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        self._base = self._proc.memory_info().rss
        self._peak, self._stop = self._base, threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self._peak = max(self._peak, self._proc.memory_info().rss)
            time.sleep(0.0002)

    def __exit__(self, *exc):
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.cuda_delta_mib = (torch.cuda.max_memory_allocated() - self._cuda_base) / 2**20
        self._stop.set()
        self._sampler.join()
        self._peak = max(self._peak, self._proc.memory_info().rss)
        self.rss_delta_mib = (self._peak - self._base) / 2**20
        return False


def memory_key(args) -> str:
    """Set ``args.device`` when unset (CUDA if available, else CPU); the result field the comparison uses there."""
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda_delta_mib" if args.device == "cuda" else "rss_delta_mib"


def run_variants(script: str, args, variants: tuple[str, str], env: dict | None = None, on_result=None) -> dict:
    """Run ``script --variant=V`` with ``args``' options for ``args.reps`` rounds per variant, alternating; returns
    ``{variant: [result dicts]}``. ``env``: defaults for the children's environment. ``on_result(variant, result)`` is called after each run (for printing)."""
    a, b = variants
    runs: dict[str, list[dict]] = {a: [], b: []}
    order = [v for i in range(args.reps) for v in ((a, b) if i % 2 == 0 else (b, a))]
    child_args = [f"--{k}={v}" for k, v in vars(args).items() if k not in ("reps", "variant") and v is not None]
    full_env = {**(env or {}), **os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}  # env: defaults
    for variant in order:
        res = subprocess.run([sys.executable, os.path.abspath(script), *child_args, f"--variant={variant}"],
                             capture_output=True, text=True, check=False, env=full_env)
        line = next((x for x in res.stdout.splitlines() if x.startswith("RESULT ")), None)
        if res.returncode or line is None:
            raise SystemExit(f"{variant} run failed:\n{res.stdout}\n{res.stderr}")
        runs[variant].append(json.loads(line[7:]))
        if on_result is not None:
            on_result(variant, runs[variant][-1])
    return runs
