"""Preset builds in a pinned worker process, so that the same preset key gives the same weights on any x86-64
machine with AVX2 (module docstring of :mod:`mutual_rl.presets.cache`).

The float results of matrix products and vectorised kernels depend on the instruction set the libraries pick at
start-up (AVX-512 on one machine, AVX2 on another) and on the thread count, and a warm-up of a few hundred steps
amplifies last-bit differences into different weights (the same 600-step warm-up gave 36 % and 18 % greedy
accuracy with 2 and 1 threads). The worker starts with :data:`PINNED_ENV` -- one OpenMP/MKL thread, ATen's
AVX2 kernels (``ATEN_CPU_CAPABILITY``), MKL's AVX2 code path in strict conditional-numerical-reproducibility mode
(``MKL_CBWR``) and oneDNN capped at AVX2 -- which must be set before torch loads, hence a fresh interpreter.
Machines of other architectures (ARM) run other kernels: their builds are deterministic but may differ, and the
quality report's ``warmstart.expect`` check says so when it matters.

Protocol: the parent writes the build's arguments as JSON (the task as its class path and dataclass fields),
runs ``python -m mutual_rl.presets.build_worker <args.json>``, whose stderr (progress bar, quality line) goes to
the user; the worker writes the ``done.json`` info to ``<tmp>/build_info.json``. A ``ValueError`` (or
``TypeError``, ``FileNotFoundError``, ``ImportError``) of the build -- bad warm-up settings, a missing package -- is
raised again in the parent with its own message; a full disk exits with :data:`DISK_FULL_EXIT`, raised again as
``OSError(ENOSPC)``; any other failure is a ``RuntimeError`` pointing to the worker's
traceback and to ``MUTUAL_RL_PRESET_BUILD=inprocess``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

DISK_FULL_EXIT = 28  # the worker's exit code for a full disk (ENOSPC), raised again as an OSError in the parent

PINNED_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2,STRICT",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MUTUAL_RL_PINNED_WORKER": "1",
}


def run_pinned(name, key, tmp: Path, seed, warmstart, task, prompt_template, chat_template, cache_dir) -> dict:
    """Run the build of :func:`mutual_rl.presets.build.build_here` in a pinned worker; its ``done.json`` info."""
    args = {
        "name": name, "key": key, "tmp": str(tmp), "seed": seed, "warmstart": dataclasses.asdict(warmstart),
        "task_class": f"{type(task).__module__}:{type(task).__qualname__}",
        "task": {f.name: getattr(task, f.name) for f in dataclasses.fields(task) if f.init},
        "prompt_template": prompt_template, "chat_template": chat_template,
        "cache_dir": None if cache_dir is None else str(cache_dir),
    }
    spec = tmp / "build_args.json"
    spec.write_text(json.dumps(args, default=str))
    env = {**os.environ, **PINNED_ENV}
    proc = subprocess.run([sys.executable, "-m", "mutual_rl.presets.build_worker", str(spec)], env=env,
                          stdout=subprocess.PIPE, text=True)
    spec.unlink(missing_ok=True)
    error = tmp / "build_error.json"
    if error.exists():  # a clear error of the build itself (bad warm-up settings): raised here as it was there
        err = json.loads(error.read_text())
        error.unlink()
        kind = {"ValueError": ValueError, "TypeError": TypeError, "FileNotFoundError": FileNotFoundError,
                "ImportError": ImportError, "ModuleNotFoundError": ImportError}.get(err["type"], RuntimeError)
        raise kind(err["message"])
    if proc.returncode == DISK_FULL_EXIT:
        import errno

        raise OSError(errno.ENOSPC, f"No space left on device (building preset {name} in its worker process)")
    if proc.returncode != 0:
        tail = proc.stdout.strip().splitlines()[-1:] if proc.stdout else []
        raise RuntimeError(f"building preset {name} failed in its worker process (exit {proc.returncode}"
                           f"{': ' + tail[0] if tail else ''}; its traceback is above). Set "
                           "MUTUAL_RL_PRESET_BUILD=inprocess to build in this process and debug it there.")
    info_path = tmp / "build_info.json"
    info = json.loads(info_path.read_text())
    info_path.unlink()
    return info


def exit_with_parent(poll_s: float = 1.0) -> None:
    """End this worker (exit 1) once the process that started it is gone: a trainer killed by a signal (an
    operator, a scheduler, the out-of-memory killer) cannot end its worker, which would otherwise build on, holding a
    core, for as long as the warm-up takes. A daemon thread polls the parent pid (the worker is re-parented when its
    parent dies); the build's temporary folder, named by the parent's pid, is left behind (the next build of the
    preset starts in its own)."""
    import threading
    import time

    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        print(f"mutual-rl preset build: the process that started this build (pid {parent}) is gone; stopping.",
              file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(path: str) -> None:
    exit_with_parent()
    from mutual_rl.model.spec import WarmStart
    from mutual_rl.presets.build import build_here

    args = json.loads(Path(path).read_text())
    module, qualname = args["task_class"].split(":")
    task = getattr(importlib.import_module(module), qualname)(**args["task"])
    tmp = Path(args["tmp"])
    try:
        info = build_here(args["name"], args["key"], tmp, args["seed"], WarmStart(**args["warmstart"]), task,
                          args["prompt_template"], args["chat_template"], args["cache_dir"])
    except (ValueError, TypeError, FileNotFoundError, ImportError) as e:
        (tmp / "build_error.json").write_text(json.dumps({"type": type(e).__name__, "message": str(e)}))
        sys.exit(3)
    except Exception as e:
        from mutual_rl.durable import disk_full_error

        if disk_full_error(tmp, "the preset", e) is not None:  # no file can be written to say so: an exit code
            print(f"mutual-rl preset build: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            raise SystemExit(DISK_FULL_EXIT) from e
        raise
    (tmp / "build_info.json").write_text(json.dumps(info, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
