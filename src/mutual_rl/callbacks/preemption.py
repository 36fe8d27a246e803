"""SIGTERM (what schedulers send before they stop a job): a checkpoint, a line saying how to resume, exit 143.

Lightning's own handling of SIGTERM records the signal, finishes the step in progress, then raises
``SIGTERMException`` -- a ``SystemExit`` *without a code*, so the process exits 0 and a scheduler records success,
with no checkpoint of the step reached and nothing said about resuming.

:class:`SigtermCheckpoint` (added by :class:`~mutual_rl.module.MutualRLModule` to every trainer through
``configure_callbacks``) turns that into what a scheduler and a user can trust:

* the step in progress finishes (Lightning stops between steps: the state is consistent);
* a checkpoint of that state is written to ``<checkpoint dir>/last.ckpt`` -- the first ``ModelCheckpoint``'s
  ``dirpath``, else ``<log dir>/checkpoints`` -- atomically, so ``--ckpt_path last`` and
  ``--ckpt_path <that file>`` both resume from it;
* one line on stderr names the step, the file and how to resume;
* the process exits with :data:`EXIT_SIGTERM` (143 = 128 + SIGTERM, what a shell reports for a process a SIGTERM
  ended), never 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

#: Exit status of a run stopped by SIGTERM (after its checkpoint is written): 128 + 15.
EXIT_SIGTERM = 143


def checkpoint_dir(trainer) -> Path:
    """Where this run's checkpoints go: the first ``ModelCheckpoint``'s ``dirpath`` (resolved as Lightning does at
    set-up), else ``<log dir>/checkpoints`` (``<default_root_dir>/checkpoints`` without a logger)."""
    for cb in trainer.callbacks:
        if isinstance(cb, ModelCheckpoint) and cb.dirpath:
            return Path(cb.dirpath)
    return Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints"


class SigtermCheckpoint(Callback):
    """On Lightning's ``SIGTERMException``: save ``last.ckpt``, say how to resume, make the exit status
    :data:`EXIT_SIGTERM` (module docstring)."""

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        exception.code = EXIT_SIGTERM  # Lightning re-raises this very exception: the process exits 143, not 0
        if trainer.state.fn != TrainerFn.FITTING:  # validate: nothing to save
            if trainer.is_global_zero:
                print(f"mutual-rl: stopped by SIGTERM. Exit status {EXIT_SIGTERM}.", file=sys.stderr, flush=True)
            return
        path = checkpoint_dir(trainer) / "last.ckpt"
        trainer.save_checkpoint(path)  # every rank takes part; rank 0 writes
        if trainer.is_global_zero:
            print(f"mutual-rl: stopped by SIGTERM after step {pl_module.global_step}; checkpoint saved to {path}. "
                  f"To resume, run the same command with --ckpt_path {path} (or --ckpt_path last; in Python: "
                  f"trainer.fit(..., ckpt_path={str(path)!r})). Exit status {EXIT_SIGTERM}.",
                  file=sys.stderr, flush=True)
