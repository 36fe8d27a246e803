"""One preset build in this process: warm-up, save, quality report (see :mod:`mutual_rl.presets.cache` for the
key, the cache and the pinned worker that normally runs this)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

from mutual_rl.presets.models import build_untrained
from mutual_rl.presets.quality import quality_report
from mutual_rl.presets.warmstart import warm_start


def build_here(name, key, tmp: Path, seed, warmstart, task, prompt_template, chat_template=False, cache_dir=None):
    """The build itself, in this process: warm-up, save, quality report; returns the ``done.json`` info."""
    from mutual_rl.thl.retokenize import prompt_ids

    model, tokenizer = build_untrained(name, seed, cache_dir=cache_dir)
    with torch.random.fork_rng(devices=[]), deterministic_kernels():
        torch.manual_seed(warmstart.seed + seed)
        losses = warm_start(
            model, tokenizer, task.train_problems(), lambda q: prompt_template.replace("{problem}", q),
            task.target_text, warmstart, desc=f"building {name}",
            encode_prompt=lambda text: prompt_ids(tokenizer, text, chat_template=chat_template),
        )
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        threads = torch.get_num_threads()  # inside the pinned context: what the warm-up ran with
        report = None
        if os.environ.get("MUTUAL_RL_PRESET_REPORT", "1") != "0":  # the test suite turns it off (speed)
            report = quality_report(model, tokenizer, task, name=name, prompt_template=prompt_template,
                                    chat_template=chat_template)
    build = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
             "threads": threads, "pinned": os.environ.get("MUTUAL_RL_PINNED_WORKER") == "1"}
    return {**key, "final_loss": losses[-1] if losses else None, "quality": report, "build": build}


@contextlib.contextmanager
def deterministic_kernels():
    """One intra-op torch thread and deterministic algorithms inside; the caller's settings restored after."""
    threads, strict = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(strict, warn_only=warn_only)
