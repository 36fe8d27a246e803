"""The progress bar of ``mutual-rl fit``: training steps out of ``trainer.max_steps``, seconds per step, the time
left and each policy's reward of the last step.

Lightning's bars count batches of an epoch; a mutual-rl run is counted in steps (``trainer.max_steps``) over an
endless prompt stream, so they showed ``Epoch 0/-2``, ``0.00it/s`` and no time left. This bar shows::

    Training  12/300 |▍         | 00:21 elapsed, ETA 08:23,  1.75s/step, gpt2/reward=0.531, llama/reward=0.406

The rate is the run's mean since the bar started (held-out evaluations included, so the ETA counts the ones still
to come); a resumed run counts from the step it resumed at. ``<policy>/reward`` is the mean reward of the
policy's last step (replayed peers' recorded reward too), the value logged under that name; ``val_pass@1`` is
added after an evaluation. Runs with ``trainer.max_steps`` unset (-1) keep Lightning's epoch counter.
"""

from __future__ import annotations

import sys
from typing import Any

from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

#: What Lightning's bar adds that says nothing here: the logger's version and the mean reward over policies.
HIDDEN = ("v_num", "reward")


class StepProgressBar(TQDMProgressBar):
    """Steps / ``max_steps``, s/step, ETA and ``<policy>/reward`` (module docstring)."""

    BAR_FORMAT = "{desc} {n_fmt}/{total_fmt} |{bar:10}| {elapsed} elapsed, ETA {remaining}, {rate_inv_fmt}{postfix}"

    @property
    def train_description(self) -> str:
        return "Training"

    def init_train_tqdm(self) -> Tqdm:
        """Lightning's training bar, counting steps."""
        max_steps = self.trainer.max_steps
        return Tqdm(desc=self.train_description, total=max_steps if max_steps and max_steps > 0 else None,
                    position=2 * self.process_position, disable=self.is_disabled, leave=True, dynamic_ncols=True,
                    file=sys.stdout, smoothing=0, unit="step", bar_format=self.BAR_FORMAT)

    def on_train_epoch_start(self, trainer, *args: Any) -> None:
        if trainer.max_steps is None or trainer.max_steps <= 0:
            super().on_train_epoch_start(trainer, *args)
            return
        if self._leave:
            self.train_progress_bar = self.init_train_tqdm()
        bar = self.train_progress_bar
        bar.reset(total=trainer.max_steps)
        bar.initial = bar.n = trainer.global_step  # a resumed run: the rate counts this run's steps only
        bar.set_description_str(self.train_description)  # no epoch: the prompt stream has none

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.max_steps is None or trainer.max_steps <= 0:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            return
        bar = self.train_progress_bar
        n = trainer.global_step
        if bar is not None and not bar.disable and self._should_update(n, bar.total):
            bar.n = n
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # refreshes the line

    def get_metrics(self, trainer, pl_module) -> dict[str, Any]:
        items = {k: v for k, v in super().get_metrics(trainer, pl_module).items() if k not in HIDDEN}
        return {**policy_rewards(pl_module), **items}


def policy_rewards(pl_module) -> dict[str, str]:
    """``<policy>/reward`` of the module's last step report (none before the first step), formatted."""
    report = getattr(pl_module, "last_report", None)
    if report is None:
        return {}
    rewards = {name: r.scoring.reward for name, r in report.policies.items()}
    rewards.update(report.replayed_rewards)
    return {f"{name}/reward": f"{value:.3f}" for name, value in rewards.items()}
