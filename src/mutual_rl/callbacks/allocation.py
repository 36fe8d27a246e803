"""``ResourceAllocation``: the MWRA callback (docs/design.md, "Decisions": it sets each policy's budget per step).

Hooks:

* ``setup``: checks the configuration against the module's policies (unknown names, a policy that would never
  update, placements -- including whether the rollout engine can honour them: ``hf`` and ``vllm`` only colocate -- a total
  below ``N * n_min``) before any step runs.
* ``on_train_batch_start``: plans this step with :func:`mutual_rl.allocation.plan_budgets` and sets
  ``pl_module.budgets = {name: Budget(n, max_new_tokens, update, placement)}``.
* ``on_train_batch_end``: reads the step's typed report (``pl_module.last_report``, a
  :class:`~mutual_rl.step.report.StepReport` reduced over ranks): each policy's all-fail fraction and its usage --
  response tokens sampled (DAPO dynamic sampling's extra rounds included) and their seconds, response tokens trained
  and their seconds --, updates the all-fail EMA used by the adaptive plan and the accounting totals, and logs
  ``alloc/<name>/n``, ``alloc/<name>/update`` and ``alloc/<name>/<field>_total``. With several processes the totals
  are over all ranks (each rank trains its own prompts; the report holds per-rank means).
* ``state_dict`` / ``load_state_dict``: the accounting totals, the all-fail EMA and the step count, so a resumed
  run plans and counts exactly as an uninterrupted one would (docs/design.md, rule 11).

Defaults give the equal plan: each policy keeps its configured ``n`` when the configured ``n`` are equal.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback

from mutual_rl.allocation import (
    COLOCATE,
    MODES,
    Accounting,
    Budget,
    plan_budgets,
    step_usage,
    update_ema,
    validate_placement,
    validate_schedule,
)
from mutual_rl.names import alloc

STATE_VERSION = 1


class ResourceAllocation(Callback):
    """Multi-Worker Resource Allocation: per-step budgets (equal or adaptive *(ours)*) and accounting."""

    def __init__(
        self,
        mode: str = "equal",
        total_rollouts: int | None = None,
        max_new_tokens: int | None = None,
        n_min: int = 2,
        eps: float = 0.05,
        ema_decay: float = 0.0,
        update_every: dict[str, int] | None = None,
        placement: dict[str, str | int] | None = None,
    ):
        """
        Args:
            mode: ``equal`` (matched compute) or ``adaptive`` *(ours)*: shares of the fixed total proportional to
                ``eps + all-fail fraction`` (largest remainder, each ``n >= n_min``); see ``allocation.plan``.
            total_rollouts: ``T``, rollouts per prompt summed over policies (default: sum of configured ``n``).
            max_new_tokens: the same max new tokens for every policy (default: each policy's own).
            n_min: adaptive: smallest group size (>= 2).
            eps: adaptive: weight floor (> 0).
            ema_decay: adaptive: all-fail fraction EMA decay in [0, 1) (0 = the last step's fraction).
            update_every: per policy ``k >= 1``: it updates on steps ``s`` with ``s % k == 0`` (default 1).
            placement: per policy ``"colocate"`` (default) or a device index serving its rollouts (the built-in
                engines accept only colocate; see ``allocation.plan``).
        """
        if mode not in MODES:
            raise ValueError(f"ResourceAllocation: mode {mode!r} is not one of: {', '.join(MODES)}.")
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"ResourceAllocation: ema_decay = {ema_decay} must be in [0, 1).")
        if total_rollouts is not None and total_rollouts < 1:
            raise ValueError(f"ResourceAllocation: total_rollouts = {total_rollouts} must be >= 1.")
        if max_new_tokens is not None and max_new_tokens < 1:
            raise ValueError(f"ResourceAllocation: max_new_tokens = {max_new_tokens} must be >= 1.")
        self.mode, self.total_rollouts, self.max_new_tokens = mode, total_rollouts, max_new_tokens
        self.n_min, self.eps, self.ema_decay = n_min, eps, ema_decay
        self.update_every = dict(update_every or {})
        self.placement = dict(placement or {})
        for name, where in self.placement.items():
            validate_placement(name, where)
        self.accounting = Accounting()
        self.all_fail_ema: dict[str, float] = {}
        self.steps = 0
        self.current: dict[str, Budget] = {}

    # ------------------------------------------------------------------------------------------ planning
    def _names(self, pl_module) -> list[str]:
        return [s.name for s in pl_module.specs]

    def total(self, pl_module) -> int:
        return self.total_rollouts if self.total_rollouts is not None else sum(s.sampling.n for s in pl_module.specs)

    def plan(self, pl_module, step: int) -> dict[str, Budget]:
        names = self._names(pl_module)
        mnt = {s.name: self.max_new_tokens or s.sampling.max_new_tokens for s in pl_module.specs}
        return plan_budgets(
            names, mnt, total=self.total(pl_module), step=step, mode=self.mode, all_fail=self.all_fail_ema,
            eps=self.eps, n_min=self.n_min, update_every=self.update_every, placement=self.placement,
        )

    def setup(self, trainer, pl_module, stage: str) -> None:
        names = self._names(pl_module)
        validate_schedule(names, self.update_every)
        for name in self.placement:
            if name not in names:
                raise ValueError(f"ResourceAllocation: placement names unknown policy {name!r}; policies: {names}.")
        num = _visible_devices()
        for name, where in self.placement.items():
            validate_placement(name, where, num)
            pl_module.engine.place(name, where)  # the engine says now whether it can honour the placement
        if self.mode == "adaptive" and self.total(pl_module) < len(names) * self.n_min:
            raise ValueError(f"ResourceAllocation: total_rollouts {self.total(pl_module)} < {len(names)} policies x "
                             f"n_min {self.n_min}.")
        self.plan(pl_module, 0)  # fail before the first step, not during it

    def on_train_batch_start(self, trainer, pl_module, batch: Any, batch_idx: int) -> None:
        self.current = self.plan(pl_module, trainer.global_step)
        pl_module.budgets = dict(self.current)

    # ---------------------------------------------------------------------------------------- accounting
    def on_train_batch_end(self, trainer, pl_module, outputs, batch: Any, batch_idx: int) -> None:
        report = pl_module.last_report
        if not self.current or report is None:
            return
        num_prompts = len(getattr(batch, "problems", ()) or ())
        log: dict[str, float] = {}
        world = max(int(getattr(trainer, "world_size", 1) or 1), 1)
        for name, b in self.current.items():
            policy = report.policies[name]
            devices = world if b.placement == COLOCATE else 1
            # the report holds per-rank means and every rank generates and trains on its own prompts
            self.accounting.add(name, step_usage(policy.usage(), devices=devices, ranks=world))
            self.all_fail_ema[name] = update_ema(self.all_fail_ema.get(name), policy.scoring.all_fail_frac,
                                                 self.ema_decay)
            log[alloc(name, "n")] = float(b.n)
            log[alloc(name, "update")] = float(b.update)
        self.steps += 1
        log.update(self.accounting.metrics())
        pl_module.log_dict(log, on_step=True, on_epoch=False, batch_size=max(num_prompts, 1))

    # --------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "accounting": self.accounting.state_dict(),
                "all_fail_ema": dict(self.all_fail_ema), "steps": self.steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("version") != STATE_VERSION:
            raise ValueError(f"ResourceAllocation: checkpoint state version {state_dict.get('version')!r} is not "
                             f"{STATE_VERSION}.")
        self.accounting.load_state_dict(state_dict["accounting"])
        self.all_fail_ema = dict(state_dict["all_fail_ema"])
        self.steps = int(state_dict["steps"])


def _visible_devices() -> int | None:
    """Accelerator devices visible to this process (None on CPU: device indices are not checked there)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else None
