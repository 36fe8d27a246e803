"""``ExperienceExchange``: the SEE bus as a Lightning callback (docs/design.md, "Decisions").

The module publishes into it and reads deliveries during ``training_step`` (protocol in ``bus.py``). The hooks:

* ``setup``: only the global-zero process writes step files; at ``fit``, it takes the store folder's OS lock
  (:class:`~mutual_rl.exchange.lock.StoreLock`), held until ``teardown`` or ``on_exception``: a second run on the
  same ``store_dir`` is refused there, naming the holder's pid and command, and a ``replay_dir`` whose lock is
  held (a recording still being written) is refused the same way; ``on_exception`` also abandons an open step (not
  accounted, not stored: the run resumes from its last checkpoint);
* ``on_fit_start`` / ``on_train_start``: the ``store_dir`` must not hold another run's recording (checked at fit
  start when the checkpoint is already restored, and again at train start, before anything is written; see
  "Recording" below);
* ``on_train_batch_start`` / ``on_train_batch_end``: for a module that does not run the exchange's step itself,
  opens the step (``begin_step(trainer.global_step)``) and ends it (accounting check, stored traffic), logging the
  flow counts with ``pl_module.log_dict``. A module whose training step opens and ends it (``owns_exchange_step =
  True``: :class:`mutual_rl.module.MutualRLModule`, through ``mutual_rl.step.pipeline.run_step``) is left alone:
  each step has one owner, and opening a step that is open is an error (``ExchangeProtocolError``);
* ``state_dict`` / ``load_state_dict``: cumulative per-flow totals and the run id, checkpointed by Lightning
  (docs/design.md, rule 11), so a resumed run continues them exactly.

Recording: each callback draws a run id, written into every step file's header and saved in the checkpoint, so a
resumed run has its first run's id. Before the first step file is written, a ``store_dir`` whose step files carry
another run id (or none: written before run ids) is refused with :class:`~mutual_rl.exchange.store.StoreInUseError`
naming the folder; a resumed run continues its own recording, after moving the steps it recorded past its
checkpoint into ``superseded-from-step-<s>/`` (it records them again). A run resumed from a checkpoint written
before run ids adopts a folder of id-less files, with a warning. ``store_dir`` and ``replay_dir`` may not be, contain
or lie inside one another (checked at construction).
"""

from __future__ import annotations

import uuid
import warnings
from typing import Any

from lightning.pytorch import Callback

from mutual_rl.distributed import agree_max
from mutual_rl.exchange.bus import ExchangeBus
from mutual_rl.exchange.lock import StoreLock, check_not_being_recorded
from mutual_rl.exchange.store import (
    StoreInUseError,
    check_store_not_replay,
    check_store_owner,
    set_aside_steps,
)


class ExperienceExchange(ExchangeBus, Callback):
    """Shared Experience Exchange: typed publish/subscribe bus with drop accounting, storage and replay."""

    def __init__(
        self,
        store_dir: str | None = None,
        replay_dir: str | None = None,
        replay_policies: list[str] | None = None,
    ):
        """
        Args:
            store_dir: write each step's exchange traffic to ``<store_dir>/step-<step>.jsonl`` (schema-versioned
                JSONL, atomic) for later replay. ``None``: don't store. A folder holding another run's recording
                is refused (use a new folder per run; a run resumed from its checkpoint continues its own).
            replay_dir: stored-peer mode: the ``store_dir`` of a recorded run to replay peers from (never the
                ``store_dir`` of this run, nor a folder inside it or around it).
            replay_policies: policies replayed from ``replay_dir`` at the same step index instead of being
                co-trained (use the recorded run's data seed and batch size).
        """
        check_store_not_replay(store_dir, replay_dir)
        ExchangeBus.__init__(self, store_dir=store_dir, replay_dir=replay_dir, replay_policies=replay_policies)
        self.run_id = uuid.uuid4().hex
        self._resumed: str | None = None  # None: a new run | "run": resumed with its run id | "legacy": without
        self._store_claimed = False
        self._lock = StoreLock(store_dir) if store_dir else None

    # ----------------------------------------------------------------------------------------- recording
    def _take_lock(self) -> None:
        """The writer takes ``store_dir``'s lock (a stale one is taken over, with a warning) and checks that
        ``replay_dir`` is not being recorded; every rank stops together when either is refused."""
        error = None
        if self.is_writer:
            try:
                if self.replay_dir:
                    check_not_being_recorded(self.replay_dir)
                note = self._lock.acquire() if self._lock is not None else None
                if note:
                    warnings.warn(note, stacklevel=2)
            except StoreInUseError as e:
                error = e
        if agree_max([int(error is not None)])[0]:
            raise error or StoreInUseError("the exchange store was refused on rank 0 (see its error)")

    def release_lock(self) -> None:
        """Release ``store_dir``'s lock (a no-op when not held)."""
        if self._lock is not None:
            self._lock.release()

    def _check_store(self) -> str | None:
        """Refuse (on every rank together) a ``store_dir`` holding another run's recording; returns the note of
        an adopted legacy recording, if any."""
        note, error = None, None
        if self.is_writer:
            try:
                note = check_store_owner(self.store_dir, self.run_id, self._resumed)
            except StoreInUseError as e:
                error = e
        if agree_max([int(error is not None)])[0]:  # several processes: all stop, none waits in a collective
            raise error or StoreInUseError(f"store_dir {self.store_dir} was refused on rank 0 (see its error)")
        return note

    def claim_store(self, start_step: int) -> None:
        """Make ``store_dir`` this run's before its first step file: refuse another run's recording, and move
        this run's steps ``>= start_step`` (recorded past the checkpoint it resumed from) aside. Called at train
        start (``trainer.global_step``) or, without a trainer, by the first ``end_step``."""
        if not self.store_dir or self._store_claimed:
            return
        note = self._check_store()
        if self.is_writer:
            if note:
                warnings.warn(note, stacklevel=2)
            moved = set_aside_steps(self.store_dir, start_step)
            if moved:
                folder, steps = moved
                warnings.warn(
                    f"store_dir {self.store_dir}: steps {steps[0]}..{steps[-1]} were recorded after the checkpoint "
                    f"this run resumes from (step {start_step}); moved to {folder} (kept, not replayed) before "
                    f"recording them again", stacklevel=2)
        self._store_claimed = True

    def end_step(self) -> dict[str, float]:
        if self.store_dir and not self._store_claimed and self.step_open:
            self.claim_store(self.current_step)
        return ExchangeBus.end_step(self)

    # ----------------------------------------------------------------------------------------- hooks
    def setup(self, trainer, pl_module, stage: str) -> None:
        self.is_writer = bool(trainer.is_global_zero)
        if stage == "fit":
            self._take_lock()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self.release_lock()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self.abandon_step()  # the step that raised is not kept (its run resumes from the last checkpoint)
        self.release_lock()

    def on_fit_start(self, trainer, pl_module) -> None:
        if self.store_dir and not trainer.strategy.restore_checkpoint_after_setup:
            self._check_store()  # the checkpoint (if any) is restored: refuse early, before any evaluation

    def on_train_start(self, trainer, pl_module) -> None:
        self._store_claimed = False  # a new fit: check the folder again, set aside what follows this start
        self.claim_store(trainer.global_step)

    def on_train_batch_start(self, trainer, pl_module, batch: Any, batch_idx: int) -> None:
        if not getattr(pl_module, "owns_exchange_step", False):
            self.begin_step(trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch: Any, batch_idx: int) -> None:
        if not getattr(pl_module, "owns_exchange_step", False) and self.step_open:
            metrics = self.end_step()
            if metrics:
                pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

    def state_dict(self) -> dict[str, Any]:
        return {**ExchangeBus.state_dict(self), "run_id": self.run_id}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        ExchangeBus.load_state_dict(self, state_dict)
        run_id = state_dict.get("run_id")
        if run_id:
            self.run_id, self._resumed = str(run_id), "run"
        else:
            self._resumed = "legacy"  # a checkpoint written before run ids
        self._store_claimed = False
