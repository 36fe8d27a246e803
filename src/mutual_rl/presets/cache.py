"""Build-once, reuse-after cache of the embedded tiny policies.

A preset is identified by everything that determines its weights (preset name, seed, warm-up settings, the task
it warms up on, the prompt template, whether prompts are wrapped in the chat template, and :data:`BUILD_VERSION`);
the hash of that names its folder under the cache root (``$MUTUAL_RL_CACHE`` or ``~/.cache/mutual_rl``).
``warmstart.expect`` is not part of it (it checks a build, it does not change one). A key whose folder ships
with the package (:mod:`mutual_rl.presets.shipped`: the presets of ``configs/base.yaml``) loads from there and
builds nothing.

Builds are deterministic and pinned: a build runs in a fresh worker process
(:mod:`mutual_rl.presets.build_worker`) with one torch thread, AVX2 kernels in ATen, MKL and oneDNN whatever the
machine offers beyond AVX2, deterministic algorithms, seeded initialisation and data order -- so the same key
gives the same weights on any x86-64 machine with AVX2 and the same torch version, whatever thread count the
caller runs with (a warm-up amplifies last-bit differences of other kernels into other weights).
``MUTUAL_RL_PRESET_BUILD=inprocess`` builds in the calling process instead (one thread and deterministic
algorithms still, but the machine's own instruction set: deterministic on that machine only; the test suite
uses it for speed); so does a task that is not a dataclass (the worker rebuilds the task from its fields).
They are written to a temporary folder and renamed into place (atomic), under a file lock so that
parallel runs build a preset only once (:func:`mutual_rl.presets.store.build_once`, also used for converted
tokenizers). After the warm-up a quality report (held-out greedy and pass@1 per skill,
:mod:`mutual_rl.presets.quality`) is printed, stored in ``done.json`` and checked against ``warmstart.expect``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from mutual_rl.model.spec import WarmStart
from mutual_rl.presets.models import ARCHS, arch_for
from mutual_rl.presets.quality import announce
from mutual_rl.presets.shipped import shipped_preset
from mutual_rl.presets.store import build_once, cache_root  # noqa: F401 (cache_root: public here too)

BUILD_VERSION = 2
"""2: one-thread deterministic builds, warm-up schedule, quality report (1: thread count of the caller)."""


def preset_key(name: str, seed: int, warmstart: WarmStart, task, prompt_template: str,
               chat_template: bool = False) -> dict:
    """What determines a preset's weights. ``chat_template`` enters only when true, so that the folders of
    presets built before it existed (all without chat template) stay valid."""
    key = {
        "preset": name,
        "seed": seed,
        "warmstart": {k: v for k, v in dataclasses.asdict(warmstart).items() if k != "expect"},
        "task": {"class": type(task).__name__, **dataclasses.asdict(task)},
        "prompt_template": prompt_template,
        "version": BUILD_VERSION,
    }
    if chat_template:
        key["chat_template"] = True
    return key


def preset_dir(key: dict, cache_dir=None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return cache_root(cache_dir) / "presets" / f"{key['preset'].replace(':', '-')}-{digest}"


def load_preset(name: str, *, seed: int, warmstart: WarmStart, task, prompt_template: str,
                chat_template: bool = False, cache_dir=None, **model_kwargs):
    """(model, tokenizer) of preset ``name``, built and cached on first use.

    ``task`` provides ``train_problems()`` and ``target_text(problem)`` (the built-in arithmetic task). The
    warm-up encodes prompts as rollouts do (``prompt_ids`` with ``chat_template``). ``model_kwargs`` (``dtype``,
    ``attn_implementation``) go to ``from_pretrained`` of the cached build (which is float32).
    """
    arch_for(name)  # validate the name before any work
    key = preset_key(name, seed, warmstart, task, prompt_template, chat_template)
    path = preset_dir(key, cache_dir)
    built = []
    shipped = shipped_preset(path.name, key)
    if shipped is not None:  # the package's own weights for this key (presets/shipped.py): nothing to build
        path = shipped
    else:
        build_once(path, lambda tmp: built.append(1) or _build(name, key, tmp, seed, warmstart, task,
                                                               prompt_template, chat_template, cache_dir))
    report = json.loads((path / "done.json").read_text()).get("quality")
    if report is not None:
        announce(name, report, warmstart.expect, built=bool(built), shipped=shipped is not None)
    model = AutoModelForCausalLM.from_pretrained(path, **{"dtype": torch.float32, **model_kwargs})
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    tokenizer.padding_side = "left"
    return model, tokenizer


def _build(name, key, tmp: Path, seed, warmstart, task, prompt_template, chat_template=False, cache_dir=None):
    """Build preset ``name`` into ``tmp``: in a pinned worker process (module docstring) unless
    ``$MUTUAL_RL_PRESET_BUILD`` is ``inprocess`` or the task cannot be described to one (not a dataclass)."""
    if chat_template and not arch_for(name).has_chat_template:
        choices = ", ".join(f"tiny:{k}" for k, a in ARCHS.items() if a.has_chat_template)
        raise ValueError(f"preset {name!r} has no chat template, but this policy sets chat_template: true; set it "
                         f"to false, or use a preset with one ({choices}).")
    mode = os.environ.get("MUTUAL_RL_PRESET_BUILD", "pinned")
    if mode not in ("pinned", "inprocess"):
        raise ValueError(f"MUTUAL_RL_PRESET_BUILD={mode!r}: use 'pinned' (default) or 'inprocess'.")
    if mode == "inprocess" or not dataclasses.is_dataclass(task):
        from mutual_rl.presets.build import build_here

        return build_here(name, key, tmp, seed, warmstart, task, prompt_template, chat_template, cache_dir)
    from mutual_rl.presets.build_worker import run_pinned

    return run_pinned(name, key, tmp, seed, warmstart, task, prompt_template, chat_template, cache_dir)
