"""Preset weights shipped inside the package, so that a config's presets are the same bytes on every machine.

A warm-up is chaotic: the same recipe, pinned to one thread and AVX2 kernels, still gave other weights and other
skills on a Xeon with AVX-512 (gpt2 ``+`` 91 % instead of 70 %), because kernels the pinning cannot reach round
differently, and a few hundred optimizer steps amplify the last bits. So the presets of the shipped benchmark
(``configs/base.yaml``) are not rebuilt: their weights travel with the package under ``presets/shipped/<folder>``,
where ``<folder>`` is the name the preset cache gives that recipe's key (:func:`mutual_rl.presets.cache.preset_dir`).
A policy whose preset key names a shipped folder loads it from there; every other key builds as before.

Each shipped folder holds what a build writes (weights, config, tokenizer) and its ``done.json``: the full key, the
quality report measured when it was built, and the ``sha256`` of ``model.safetensors``. Loading checks both: a key
that differs from the request (a digest collision, a hand-edited folder) or weights whose hash differs is one error
naming the folder. ``MUTUAL_RL_PRESET_SHIPPED=0`` ignores the shipped folders and builds from the recipe into the
cache (to check that the recipe still gives them on your machine: on the 2-core AVX2 machine they were built on it
gives the same bytes; elsewhere it may not, which is why they are shipped). ``scripts/ship_presets.py`` writes them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
"""Where the shipped preset folders live (package data)."""

WEIGHTS = "model.safetensors"


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _normalised(key: dict) -> dict:
    """The key as ``done.json`` stores it (JSON types: tuples as lists, non-JSON values as strings)."""
    return json.loads(json.dumps(key, default=str))


def shipped_preset(folder: str, key: dict) -> Path | None:
    """The shipped folder for preset ``key`` (cache folder name ``folder``), checked; None when there is none or
    ``MUTUAL_RL_PRESET_SHIPPED=0``."""
    mode = os.environ.get("MUTUAL_RL_PRESET_SHIPPED", "1")
    if mode not in ("0", "1"):
        raise ValueError(f"MUTUAL_RL_PRESET_SHIPPED={mode!r}: use 1 (default: load shipped presets) or 0 (build "
                         "every preset from its recipe).")
    path = SHIPPED_DIR / folder
    if mode == "0" or not (path / "done.json").is_file():
        return None
    info = json.loads((path / "done.json").read_text())
    stored = {k: info.get(k) for k in key}
    if stored != _normalised(key):
        raise RuntimeError(f"shipped preset {path}: its done.json key {stored} is not the requested {key}; the "
                           "package's preset folder is damaged: reinstall mutual-rl, or set "
                           "MUTUAL_RL_PRESET_SHIPPED=0 to build the preset from its recipe.")
    digest = file_sha256(path / WEIGHTS) if (path / WEIGHTS).is_file() else None
    if digest != info.get("sha256"):
        raise RuntimeError(f"shipped preset {path}: {WEIGHTS} has sha256 {digest}, but done.json records "
                           f"{info.get('sha256')}; the package's preset folder is damaged: reinstall mutual-rl, or "
                           "set MUTUAL_RL_PRESET_SHIPPED=0 to build the preset from its recipe.")
    return path
