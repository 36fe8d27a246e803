"""Build-once, reuse-after cache of the embedded tiny policies.

A preset is identified by everything that determines its weights (preset name, seed, warm-up settings, the task
it warms up on, the prompt template, and :data:`BUILD_VERSION`); the hash of that names its folder under the
cache root (``$MUTUAL_RL_CACHE`` or ``~/.cache/mutual_rl``). Builds are deterministic, written to a temporary
folder and renamed into place (atomic), under a file lock so that parallel runs build a preset only once.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from mutual_rl.policies.spec import WarmStart
from mutual_rl.presets.models import arch_for, build_untrained
from mutual_rl.presets.warmstart import warm_start

BUILD_VERSION = 1


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("MUTUAL_RL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "mutual_rl"


def preset_key(name: str, seed: int, warmstart: WarmStart, task, prompt_template: str) -> dict:
    return {
        "preset": name,
        "seed": seed,
        "warmstart": dataclasses.asdict(warmstart),
        "task": {"class": type(task).__name__, **dataclasses.asdict(task)},
        "prompt_template": prompt_template,
        "version": BUILD_VERSION,
    }


def preset_dir(key: dict, cache_dir=None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return cache_root(cache_dir) / "presets" / f"{key['preset'].replace(':', '-')}-{digest}"


def load_preset(name: str, *, seed: int, warmstart: WarmStart, task, prompt_template: str, cache_dir=None):
    """(model, tokenizer) of preset ``name``, built and cached on first use.

    ``task`` provides ``train_problems()`` and ``target_text(problem)`` (the built-in arithmetic task).
    """
    arch_for(name)  # validate the name before any work
    key = preset_key(name, seed, warmstart, task, prompt_template)
    path = preset_dir(key, cache_dir)
    if not (path / "done.json").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.parent / f".{path.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (path / "done.json").exists():
                _build(name, key, path, seed, warmstart, task, prompt_template)
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    tokenizer.padding_side = "left"
    return model, tokenizer


def _build(name, key, path: Path, seed, warmstart, task, prompt_template):
    start = time.perf_counter()
    model, tokenizer = build_untrained(name, seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(warmstart.seed + seed)
        losses = warm_start(
            model, tokenizer, task.train_problems(), lambda q: prompt_template.replace("{problem}", q),
            task.target_text, warmstart, desc=f"building {name}",
        )
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    info = {**key, "seconds": round(time.perf_counter() - start, 1), "final_loss": losses[-1] if losses else None}
    (tmp / "done.json").write_text(json.dumps(info, indent=1, default=str))
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
