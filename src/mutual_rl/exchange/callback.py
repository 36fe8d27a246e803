"""``ExperienceExchange``: the SEE bus as a Lightning callback (docs/design.md, "Decisions").

The module publishes into it and reads deliveries during ``training_step`` (protocol in ``bus.py``). The hooks:

* ``setup``: only the global-zero process writes step files;
* ``on_train_batch_start``: opens the step (``begin_step(trainer.global_step)``) unless the module already did;
* ``on_train_batch_end``: if the module did not call ``end_step`` itself, ends the step (accounting check,
  stored traffic) and logs the flow counts with ``pl_module.log_dict``; a module that calls ``end_step`` logs the
  returned metrics itself;
* ``state_dict`` / ``load_state_dict``: cumulative per-flow totals, checkpointed by Lightning (docs/design.md, rule 11), so
  a resumed run continues them exactly.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback

from mutual_rl.exchange.bus import ExchangeBus


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
                JSONL, atomic) for later replay. ``None``: don't store.
            replay_dir: stored-peer mode: the ``store_dir`` of a recorded run to replay peers from.
            replay_policies: policies replayed from ``replay_dir`` at the same step index instead of being
                co-trained (use the recorded run's data seed and batch size).
        """
        ExchangeBus.__init__(self, store_dir=store_dir, replay_dir=replay_dir, replay_policies=replay_policies)

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.is_writer = bool(trainer.is_global_zero)

    def on_train_batch_start(self, trainer, pl_module, batch: Any, batch_idx: int) -> None:
        if not self.step_open:
            self.begin_step(trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch: Any, batch_idx: int) -> None:
        if self.step_open:
            metrics = self.end_step()
            if metrics:
                pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

    def state_dict(self) -> dict[str, Any]:
        return ExchangeBus.state_dict(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        ExchangeBus.load_state_dict(self, state_dict)
