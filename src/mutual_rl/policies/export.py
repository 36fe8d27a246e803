"""Hugging Face exports of every policy: at the end of fit and, with ``model.export_every_n_steps``, during it.

Layout under the export root (``model.export_dir``, default ``<log_dir>/export``)::

    <root>/<policy>/                 the end of fit
    <root>/step-000100/<policy>/     after training step 100 (export_every_n_steps: 100)

Each folder holds what :meth:`~mutual_rl.policies.policy.Policy.export` writes (full weights, or the LoRA adapters)
and the policy's tokenizer, so ``AutoModelForCausalLM.from_pretrained(folder)`` (or peft's loader for adapters)
reloads it. A folder is written under a temporary name and renamed into place, so a run stopped mid-export never
leaves a half-written checkpoint under the final name.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from mutual_rl.strategies import full_params


def step_folder(root: Path, step: int) -> Path:
    """Where the periodic export after training step ``step`` (1-based count of finished steps) goes."""
    return Path(root) / f"step-{step:06d}"


def export_policies(policies: Mapping, root: Path, *, write: bool) -> list[Path]:
    """Export every policy to ``root/<name>``; under FSDP every rank gathers the full weights (a collective) and
    only the rank with ``write`` saves them. Returns the folders written (empty where ``write`` is False)."""
    written = []
    for name, policy in policies.items():
        with full_params(policy.model):
            if write:
                final = Path(root) / name
                tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
                shutil.rmtree(tmp, ignore_errors=True)
                policy.export(tmp)
                shutil.rmtree(final, ignore_errors=True)
                os.replace(tmp, final)
                written.append(final)
    return written
