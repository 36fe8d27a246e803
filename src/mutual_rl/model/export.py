"""Hugging Face exports of every policy: at the end of fit and, with ``model.export_every_n_steps``, during it.

Layout under the export root (``model.export_dir``, default ``<log_dir>/export``)::

    <root>/<policy>/                 the end of fit
    <root>/step-000100/<policy>/     after training step 100 (export_every_n_steps: 100)

Each folder holds what :meth:`~mutual_rl.model.policy.Policy.export` writes (full weights, or the LoRA adapters)
and the policy's tokenizer, so ``AutoModelForCausalLM.from_pretrained(folder)`` (or peft's loader for adapters)
reloads it. A folder is written under a temporary name and renamed into place, so a run stopped mid-export never
leaves a half-written checkpoint under the final name (see :func:`export_policies`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from mutual_rl.distributed import raise_together
from mutual_rl.durable import disk_full_error
from mutual_rl.strategies import full_params


def step_folder(root: Path, step: int) -> Path:
    """Where the periodic export after training step ``step`` (1-based count of finished steps) goes."""
    return Path(root) / f"step-{step:06d}"


def export_policies(policies: Mapping, root: Path, *, write: bool) -> list[Path]:
    """Export every policy to ``root/<name>``; under FSDP every rank gathers the full weights (a collective) and
    only the rank with ``write`` saves them. Returns the folders written (empty where ``write`` is False).

    A failed write (a full disk: one ``OSError`` naming the policy, the folder, the free space and what was exported;
    no permission)
    does not stop the gathering of the other policies' weights, which the other ranks take part in; after the last policy every rank raises together (the writer its own error), so
    no rank waits forever in a later collective. An existing export is replaced only once the new one is complete:
    the old folder is moved aside, the new one renamed in, then the old one deleted."""
    written, error = [], None
    for name, policy in policies.items():
        with full_params(policy.model):
            if write and error is None:
                try:
                    written.append(_write(policy, Path(root) / name))
                except Exception as exc:  # noqa: BLE001 - raised after the gathering, on every rank together
                    error = disk_full_error(Path(root) / name, f"the export of policy {name!r} to", exc,
                                            _kept(Path(root), name, written)) or exc
                    if error is not exc:
                        error.__cause__ = exc
    raise_together(error, f"exporting the policies to {root}")
    return written


def _kept(root: Path, name: str, written: list[Path]) -> str:
    """What a failed export of ``name`` left, in words."""
    done = f"exported before it: {', '.join(p.name for p in written)}" if written else "no policy was exported"
    before = "its previous export there is kept" if (root / name).exists() else "no folder of it was left"
    return f"{done}, {before}"


def _write(policy, final: Path) -> Path:
    tag = f"{final.name}.{os.getpid()}"
    tmp, old = final.with_name(f".{tag}.tmp"), final.with_name(f".{tag}.old")
    for stale in final.parent.glob(f".{final.name}.*.tmp") if final.parent.exists() else []:
        shutil.rmtree(stale, ignore_errors=True)  # left by a run that was killed mid-export
    try:
        policy.export(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # no half-written folder left (a full disk, an interrupt)
        raise
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final
