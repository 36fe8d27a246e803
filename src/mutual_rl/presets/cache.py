"""Build-once, reuse-after cache of the embedded tiny policies.

A preset is identified by everything that determines its weights (preset name, seed, warm-up settings, the task
it warms up on, the prompt template, whether prompts are wrapped in the chat template, and :data:`BUILD_VERSION`);
the hash of that names its folder under the cache root (``$MUTUAL_RL_CACHE`` or ``~/.cache/mutual_rl``). Builds
are deterministic, written to a temporary folder and renamed into place (atomic), under a file lock so that
parallel runs build a preset only once (:func:`mutual_rl.presets.store.build_once`, also used for converted tokenizers).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from mutual_rl.policies.spec import WarmStart
from mutual_rl.presets.models import ARCHS, arch_for, build_untrained
from mutual_rl.presets.store import build_once, cache_root  # noqa: F401 (cache_root: public here too)
from mutual_rl.presets.warmstart import warm_start

BUILD_VERSION = 1


def preset_key(name: str, seed: int, warmstart: WarmStart, task, prompt_template: str,
               chat_template: bool = False) -> dict:
    """What determines a preset's weights. ``chat_template`` enters only when true, so that the folders of
    presets built before it existed (all without chat template) stay valid."""
    key = {
        "preset": name,
        "seed": seed,
        "warmstart": dataclasses.asdict(warmstart),
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
    build_once(path, lambda tmp: _build(name, key, tmp, seed, warmstart, task, prompt_template, chat_template,
                                        cache_dir))
    model = AutoModelForCausalLM.from_pretrained(path, **{"dtype": torch.float32, **model_kwargs})
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    tokenizer.padding_side = "left"
    return model, tokenizer


def _build(name, key, tmp: Path, seed, warmstart, task, prompt_template, chat_template=False, cache_dir=None):
    from mutual_rl.thl.retokenize import prompt_ids

    model, tokenizer = build_untrained(name, seed, cache_dir=cache_dir)
    if chat_template and not getattr(tokenizer, "chat_template", None):
        choices = ", ".join(f"tiny:{k}" for k, a in ARCHS.items() if a.has_chat_template)
        raise ValueError(f"preset {name!r} has no chat template, but this policy sets chat_template: true; set it "
                         f"to false, or use a preset with one ({choices}).")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(warmstart.seed + seed)
        losses = warm_start(
            model, tokenizer, task.train_problems(), lambda q: prompt_template.replace("{problem}", q),
            task.target_text, warmstart, desc=f"building {name}",
            encode_prompt=lambda text: prompt_ids(tokenizer, text, chat_template=chat_template),
        )
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    return {**key, "final_loss": losses[-1] if losses else None}
