"""Stored-peer mode: replay a peer's recorded groups from a run's stored exchange traffic (GRAFT §6.2).

A receiver trains against a peer's *recorded* run without co-training it. Replay is by **step index**: step ``s``
of the receiver's run gets the peer's groups of the recorded step ``s`` (file ``step-<s>.jsonl``, see ``store.py``).
This is only meaningful if both runs saw the same prompts at the same step, i.e. the receiver's run uses the same
data (seed, batch size, files) as the recorded run; :meth:`StoredPeer.groups` checks that the recorded prompt ids
equal the receiver's batch prompt ids and raises :class:`ReplayMismatchError` otherwise. Groups come back exactly
as published (source-computed advantages included, never renormalised), as CPU tensors, in the order of the
receiver's ``prompt_ids``. :meth:`StoredPeer.traces` reads back the THL-aligned traces of the peer's responses that
the recorded run stored (trace records, receiver-side; see ``records.py``). Every record read is cross-checked
(``checks.check_stored_record``), and the step files read must all come from one run (their headers' ``run_id``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from mutual_rl.exchange.records import TraceRecord, groups_from_records
from mutual_rl.exchange.store import StoredStep, StoredTrafficError, read_step, stored_steps
from mutual_rl.types import ScoredGroup


class ReplayMismatchError(ValueError):
    """The recorded peer's prompts at a step differ from the receiver's batch prompts."""


def _preview(ids: Sequence[int], k: int = 8) -> str:
    ids = list(ids)
    return str(ids) if len(ids) <= k else f"[{', '.join(map(str, ids[:k]))}, ... ({len(ids)} in all)]"


class StepCache:
    """Reads step files on demand and keeps the last one (several replayed peers share one file per step)."""

    def __init__(self, store_dir: str | os.PathLike):
        self.store_dir = Path(store_dir)
        if not self.store_dir.is_dir():
            raise StoredTrafficError(f"stored exchange directory {self.store_dir} does not exist")
        self._step: int | None = None
        self._groups: dict[str, list[ScoredGroup]] = {}
        self._file: StoredStep | None = None
        self._run: tuple[str, Path] | None = None  # the recording run's id and the first file that named it

    def load(self, step: int) -> tuple[StoredStep, dict[str, list[ScoredGroup]]]:
        if self._step != step:
            stored = read_step(self.store_dir, step)
            if stored.run_id is not None:  # one recording per folder: a file of another run is an error
                if self._run is None:
                    self._run = (stored.run_id, stored.path)
                elif stored.run_id != self._run[0]:
                    raise StoredTrafficError(
                        f"{stored.path} was recorded by run {stored.run_id}, but {self._run[1]} by run "
                        f"{self._run[0]}: {self.store_dir} mixes two runs' recordings, so replaying it would mix "
                        f"their traffic. Replay a folder that holds one run's recording."
                    )
            try:
                groups = groups_from_records(stored.records)
            except ValueError as e:
                raise StoredTrafficError(f"{stored.path}: {e}") from e
            by_policy: dict[str, list[ScoredGroup]] = {}
            for g in groups:
                by_policy.setdefault(g.policy_id, []).append(g)
            self._step, self._file, self._groups = step, stored, by_policy
        return self._file, self._groups


class StoredPeer:
    """Replays ``policy_id``'s groups from the traffic stored in ``store_dir`` (``ExperienceExchange(store_dir=)``).

    Example::

        peer = StoredPeer("runs/a/exchange", "gpt2")
        groups = peer.groups(step=12, prompt_ids=[p.prompt_id for p in batch.problems])
    """

    def __init__(self, store_dir: str | os.PathLike, policy_id: str, cache: StepCache | None = None):
        self.policy_id = policy_id
        self._cache = cache or StepCache(store_dir)
        self.store_dir = self._cache.store_dir

    def steps(self) -> list[int]:
        """The recorded steps (those with a step file), sorted."""
        return stored_steps(self.store_dir)

    def groups(self, step: int, prompt_ids: Sequence[int] | None = None) -> list[ScoredGroup]:
        """The peer's recorded groups of ``step``.

        With ``prompt_ids`` (the receiver's batch, in order), checks that the recorded groups' prompt ids are the
        same multiset (one group per prompt) and returns them in that order; otherwise returns them in recorded order.
        Raises :class:`StoredTrafficError` (missing/corrupt file, peer absent from the step) or
        :class:`ReplayMismatchError` (different prompts).
        """
        stored, by_policy = self._cache.load(step)
        if self.policy_id not in by_policy:
            have = sorted(by_policy)
            raise StoredTrafficError(
                f"{stored.path}: no groups of policy {self.policy_id!r} at step {step} (policies in file: {have})"
            )
        groups = by_policy[self.policy_id]
        if prompt_ids is None:
            return list(groups)
        recorded = [g.prompt_id for g in groups]
        if sorted(recorded) != sorted(prompt_ids):
            raise ReplayMismatchError(
                f"stored peer {self.policy_id!r}, step {step} ({stored.path}): recorded prompt ids "
                f"{_preview(recorded)} differ from this run's batch prompt ids {_preview(prompt_ids)}. Stored-peer "
                f"mode replays by step index: run the receiver with the same data (data seed, batch size, prompt "
                f"files) as the recorded run."
            )
        by_prompt: dict[int, list[ScoredGroup]] = {}
        for g in groups:
            by_prompt.setdefault(g.prompt_id, []).append(g)
        return [by_prompt[p].pop(0) for p in prompt_ids]  # a repeated prompt takes its groups in recorded order

    def traces(self, step: int, receiver_id: str | None = None) -> list[TraceRecord]:
        """The trace records of ``step`` whose source is this peer (only those aligned onto ``receiver_id``'s
        tokens, if given), in stored order; ``[]`` when the recorded run stored none. Raises
        :class:`StoredTrafficError` for a missing or corrupt step file."""
        stored, _ = self._cache.load(step)
        return [r for r in stored.records if isinstance(r, TraceRecord) and r.policy_id == self.policy_id
                and (receiver_id is None or r.receiver_id == receiver_id)]

    def __iter__(self) -> Iterator[tuple[int, list[ScoredGroup]]]:
        """``(step, groups)`` for every recorded step, in step order."""
        for step in self.steps():
            yield step, self.groups(step)
