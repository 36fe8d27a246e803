"""Faults of a rollout engine inside a training step: :class:`RolloutFault`.

An exception raised by an engine's ``generate`` or ``sync_weights`` (a CUDA error, a vLLM worker that died, a bug in
a custom engine) is re-raised by :mod:`mutual_rl.step.pipeline` as one :class:`RolloutFault` naming the policy, the
engine, the phase and the step, with the engine's exception as its ``__cause__``:

* ``generate`` (sampling, before any policy of the step was updated): raised at once. ``rng`` holds the sampling
  streams as they were when the step began, so that a checkpoint of that moment can be written
  (:class:`~mutual_rl.callbacks.rollout_faults.RolloutFaultCheckpoint`) and the step, resumed, draws what it drew;
* ``sync_weights`` (after the policy's update): the step is finished first -- every other policy trains and syncs,
  the report is complete -- and the fault is kept in ``StepContext.sync_faults`` when the host gives that list (the
  Lightning module does; its callback raises it before the engine is used again), else raised at the end of the
  step with ``report`` set to the finished step's report.
"""

from __future__ import annotations

PHASES = ("generate", "sync_weights")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class RolloutFault(RuntimeError):
    """A rollout engine's ``generate`` or ``sync_weights`` raised (module docstring).

    Attributes: ``policy`` (name; None for the copy raised on the other ranks), ``engine`` (its class name),
    ``phase`` (:data:`PHASES`), ``step``, ``rng`` (the sampling streams at the step's start, ``generate`` only),
    ``report`` (the finished step's report, ``sync_weights`` raised by the pipeline itself), ``checkpoint`` (the
    ``last.ckpt`` written for it, once written)."""

    def __init__(self, policy: str | None, engine: str, phase: str, step: int, cause: BaseException | None,
                 rng: dict | None = None):
        self.policy, self.engine, self.phase, self.step = policy, engine, phase, step
        self.cause_text = _first_line(cause) if cause is not None else "see the other rank's error"
        self.rng, self.report, self.checkpoint = rng, None, None
        super().__init__(self._message())

    def _message(self) -> str:
        who = f"policy {self.policy!r}" if self.policy is not None else "a policy on another rank"
        text = (f"the rollout engine ({self.engine}) of {who} failed in {self.phase} at step {self.step}: "
                f"{self.cause_text}.")
        if self.phase == "sync_weights":
            text += (f" Step {self.step} itself finished (every policy updated and logged); the engine's copy of "
                     "the weights is stale, so the run stopped before using it again.")
        if self.checkpoint is not None:
            kept = (f"the state before step {self.step}, nothing of it kept" if self.phase == "generate" else
                    f"the state after step {self.step}; the engine loads its weights from it")
            text += (f" Checkpoint saved to {self.checkpoint} ({kept}); to resume, run the same command with "
                     f"--ckpt_path last (or --ckpt_path {self.checkpoint}).")
        return text

    def saved(self, path) -> None:
        """Record that ``path`` (a ``last.ckpt``) was written for this fault: the message says so."""
        self.checkpoint = str(path)
        self.args = (self._message(),)


def engine_name(engine) -> str:
    """The engine's class name (``rollout_engine: auto``: the one it chose)."""
    return type(getattr(engine, "chosen", None) or engine).__name__


def raise_fault_together(error: BaseException | None, fault: RolloutFault, what: str) -> None:
    """:func:`~mutual_rl.distributed.raise_together` that keeps a rollout fault a :class:`RolloutFault` on every
    rank: when any rank's ``error`` is one, each rank raises a RolloutFault (its own, else ``fault``, the copy naming
    no policy, with this rank's own error as its cause), so that every rank writes the checkpoint together. Other
    errors as ``raise_together``. In one process: ``error`` re-raised, if any."""
    from mutual_rl.distributed import agree_max, is_distributed, raise_together

    if not is_distributed():
        if error is not None:
            raise error
        return
    code = 2 if isinstance(error, RolloutFault) else int(error is not None)
    if agree_max([code])[0] == 2 and not isinstance(error, RolloutFault):
        raise fault from error
    raise_together(error, what)


def collect_sync_faults(faults: list[RolloutFault], copy: RolloutFault) -> list[RolloutFault]:
    """The step's weight-sync faults of this rank; under several processes, if another rank had one and this rank
    none, ``[copy]`` (the copy naming no policy), so that every rank stops at the same point."""
    from mutual_rl.distributed import agree_max, is_distributed

    if is_distributed() and agree_max([int(bool(faults))])[0] and not faults:
        return [copy]
    return faults


__all__ = ["PHASES", "RolloutFault", "collect_sync_faults", "engine_name", "raise_fault_together"]
