"""This process's sampling streams as one value: :func:`rng_state` takes them, :func:`set_rng_state` puts them back.

The step takes them at its start (a rollout fault carries them, ``step/faults.py``), the module saves them in a
checkpoint and puts them back on resume (``resume.py``), and the rollout-fault callback puts a fault's back before
it writes its checkpoint.
"""

from __future__ import annotations

import random

import torch


def rng_state() -> dict:
    """This process's sampling streams: torch's CPU generator, Python's ``random`` and, on GPUs, every CUDA
    generator (sampling there draws from the accelerator's)."""
    rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def set_rng_state(rng: dict) -> None:
    """Put back a stream of :func:`rng_state` (CUDA generators only when the device count matches)."""
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    cuda = rng.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
