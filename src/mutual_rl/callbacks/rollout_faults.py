"""A rollout engine's fault mid-run: ``last.ckpt`` of a consistent state, one paragraph, a non-zero exit.

:class:`RolloutFaultCheckpoint` (added by :class:`~mutual_rl.module.MutualRLModule` to every trainer through
``configure_callbacks``) handles the :class:`~mutual_rl.step.faults.RolloutFault` of the training step:

* a fault in ``generate`` at step k is raised mid-step, before any policy of the step was updated: the sampling
  streams are put back to those of the step's start (the fault carries them) and ``last.ckpt`` is written -- the
  state before step k, which the step counter, the data stream and the exchange's totals already say;
* a fault in ``sync_weights`` at step k is kept by the step (which finishes: every policy updated, the step logged)
  in the module's ``sync_faults`` and raised here before the engine is used again -- at the start of the next step,
  of a validation, or at the end of training -- and ``last.ckpt`` is written: the state after step k;
* the checkpoint goes where SIGTERM's goes (:func:`~mutual_rl.callbacks.preemption.checkpoint_dir`), atomically;
  the fault's message then names it and how to resume (``--ckpt_path last``), and the exception propagates: the
  ``mutual-rl`` command prints it as one paragraph and exits 1 (:mod:`mutual_rl.cli_errors`).

Resuming from that ``last.ckpt`` with the same command reaches the weights of a run that had no fault (tested
bit-exactly on the CPU, ``tests/reliability/test_rollout_faults.py``).
"""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn

from mutual_rl.callbacks.preemption import checkpoint_dir
from mutual_rl.rng import set_rng_state
from mutual_rl.step.faults import RolloutFault


class RolloutFaultCheckpoint(Callback):
    """Raise a kept weight-sync fault before the engine is used again; on any rollout fault write ``last.ckpt``
    (module docstring)."""

    @staticmethod
    def _raise_kept(pl_module) -> None:
        faults = getattr(pl_module, "sync_faults", None)
        if faults:
            fault = faults[0]
            faults.clear()
            raise fault

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._raise_kept(pl_module)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._raise_kept(pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._raise_kept(pl_module)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not isinstance(exception, RolloutFault) or trainer.state.fn != TrainerFn.FITTING:
            return
        if exception.rng is not None:
            set_rng_state(exception.rng)  # the streams of the step's start: the resumed step draws the same
        path = checkpoint_dir(trainer) / "last.ckpt"
        # Lightning adds 1 to the logger's step count when it restarts from a checkpoint taken neither at a batch's
        # end nor at the last one, as this is; saved one lower, the resumed steps log at the steps they are
        loop = trainer.fit_loop.epoch_loop
        loop._batches_that_stepped -= 1
        try:
            trainer.save_checkpoint(path)  # every rank takes part (each raised a RolloutFault); rank 0 writes
        finally:
            loop._batches_that_stepped += 1
        exception.saved(path)
