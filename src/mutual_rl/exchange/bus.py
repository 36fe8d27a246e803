"""The SEE bus: publish/subscribe of scored groups, with exact drop accounting, storage and replay.

Protocol of one training step (the module drives it; :class:`~mutual_rl.exchange.callback.ExperienceExchange`
also opens/closes steps from its hooks when the module does not)::

    bus.begin_step(step)                       # opens the step's mailbox (empty)
    bus.replay_groups(step, prompt_ids)        # stored-peer mode only: publishes the recorded peers' groups
    bus.publish(group)                         # each (non-replayed) policy, each of its groups
    bus.deliveries(receiver)                   # {source: [ScoredGroup]} -- peers' groups, never its own
    bus.report(receiver, source, consumed, dropped)
    metrics = bus.end_step()                   # checks the accounting, writes the step file, returns flow counts

Subscriptions: ``subscribe(receiver, kinds, sources=None)`` once per receiver, ``kinds`` from
``{"rollout", "reward", "advantage"}`` (its regime's needs; empty = receives nothing). A subscribed receiver is
delivered *every* group that a source in ``sources`` (default: all other policies) publishes in the step; groups
are delivered whole whatever the kinds (a reward-only subscriber such as XGRPO still gets ``ScoredGroup``s with
rollouts; the kinds document and log what it uses, they do not strip fields).

Accounting, in units of responses: a flow ``source->receiver`` is delivered ``Σ n`` units per step (``n`` =
responses per delivered group; for a reward-only subscriber one unit = one reward record). The receiver reports
``consumed`` and ``dropped`` (``{reason: count}``, e.g. ``gate_closed``, ``compat_below_floor``, ``over_budget``,
``not_subscribed``); several reports for one flow add up. ``end_step`` raises :class:`ExchangeAccountingError`
naming the receiver (and its regime), the source and the counts if a delivered flow was not reported or
``consumed + Σ dropped != delivered``; nothing is silently lost. Per-step counts are returned as
``exchange/<source>-><receiver>/delivered|consumed|dropped/<reason>`` plus ``exchange/<source>/published``;
cumulative totals are kept in :meth:`totals` and in the state dict (checkpointed by the callback).

Trace records (THL-aligned traces, receiver-side; the module publishes them after a receiver's plan,
``publish(records.trace_records(plan.crossed, deliveries))``) are stored with the step's traffic but neither
delivered nor accounted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mutual_rl.distributed import agree_max, gather_to_zero
from mutual_rl.exchange.records import (
    GROUP_KINDS,
    Record,
    TraceRecord,
    check_group,
    groups_from_records,
    records_from_group,
)
from mutual_rl.exchange.replay import StepCache, StoredPeer
from mutual_rl.exchange.store import write_step
from mutual_rl.names import dropped as dropped_count
from mutual_rl.names import exchange as exchange_name
from mutual_rl.names import flow, published
from mutual_rl.types import ScoredGroup

STATE_VERSION = 1


class ExchangeAccountingError(RuntimeError):
    """Delivered exchange records were not all consumed or dropped with a reason."""


class ExchangeProtocolError(RuntimeError):
    """The bus was used out of order (publish before begin_step, duplicate group, unknown receiver, ...)."""


@dataclass(frozen=True)
class Subscription:
    kinds: frozenset[str]
    sources: frozenset[str] | None  # None = every other policy
    regime: str | None = None  # for error messages only

    def accepts(self, receiver: str, source: str) -> bool:
        return bool(self.kinds) and source != receiver and (self.sources is None or source in self.sources)


def flow_name(source: str, receiver: str) -> str:
    """``<source>-><receiver>`` (:func:`mutual_rl.names.flow`)."""
    return flow(source, receiver)


class ExchangeBus:
    """Publish/subscribe bus with drop accounting (see the module docstring for the protocol)."""

    run_id: str | None = None  # written into the step files' headers (set by ExperienceExchange)

    def __init__(
        self,
        store_dir: str | None = None,
        replay_dir: str | None = None,
        replay_policies: list[str] | None = None,
    ):
        """
        Args:
            store_dir: write each step's exchange traffic (all published groups and traces) to
                ``<store_dir>/step-<step>.jsonl`` (schema-versioned JSONL, atomic writes). ``None``: don't store.
            replay_dir: stored-peer mode: the ``store_dir`` of a recorded run to replay peers from.
            replay_policies: the policies replayed from ``replay_dir`` instead of being co-trained; their
                recorded groups are delivered at the same step index (the run must use the same data seed and
                batch size as the recorded run).
        """
        if bool(replay_dir) != bool(replay_policies):
            raise ValueError("stored-peer mode needs both replay_dir and replay_policies (or neither).")
        if replay_policies and len(set(replay_policies)) != len(replay_policies):
            raise ValueError(f"replay_policies has duplicates: {replay_policies}")
        self.store_dir, self.replay_dir = store_dir, replay_dir
        self.replay_policies: list[str] = list(replay_policies or [])
        self._replay_cache = StepCache(replay_dir) if replay_dir else None
        self.is_writer = True  # only the global-zero process writes step files (set by the callback)
        self._subs: dict[str, Subscription] = {}
        self._totals: dict[str, Counter] = {}
        self._steps_ended = 0
        self._last_step: int | None = None
        self._step: int | None = None
        self._reset_mailbox()

    # ----------------------------------------------------------------------------------------- set-up
    @property
    def replayed_policies(self) -> list[str]:
        """The policies replayed from stored traffic (the module neither generates nor trains them)."""
        return list(self.replay_policies)

    def subscribe(self, receiver: str, kinds: Iterable[str], sources: Iterable[str] | None = None,
                  regime: str | None = None) -> None:
        """Subscribe ``receiver`` to ``kinds`` from ``sources`` (default: all other policies); replaces a
        previous subscription of the same receiver. ``regime`` only names the regime in error messages."""
        kinds = frozenset(kinds)
        unknown = kinds - GROUP_KINDS
        if unknown:
            raise ValueError(
                f"receiver {receiver!r}: cannot subscribe to {sorted(unknown)}; subscribable kinds are "
                f"{sorted(GROUP_KINDS)} (trace records are made on the receiver side by the THL)"
            )
        if receiver in self.replay_policies:
            raise ValueError(f"policy {receiver!r} is replayed from {self.replay_dir}; it cannot receive")
        self._subs[receiver] = Subscription(kinds, None if sources is None else frozenset(sources), regime)

    @property
    def subscriptions(self) -> dict[str, Subscription]:
        return dict(self._subs)

    # ------------------------------------------------------------------------------------------ a step
    def _reset_mailbox(self) -> None:
        self._published: dict[str, list[ScoredGroup]] = {}
        self._keys: set[tuple] = set()
        self._traces: list[TraceRecord] = []
        self._reports: dict[tuple[str, str], Counter] = {}
        self._replayed: dict[str, list[ScoredGroup]] | None = None

    @property
    def step_open(self) -> bool:
        return self._step is not None

    @property
    def current_step(self) -> int | None:
        return self._step

    def begin_step(self, step: int) -> None:
        """Open ``step`` with an empty mailbox; a step has one owner, so opening while a step is open is an error."""
        if self._step is not None:
            raise ExchangeProtocolError(
                f"begin_step({step}): step {self._step} is open and was not ended (call end_step); a step is opened "
                f"once, by the training step (run_step) or, for a module that does not run one, by the "
                f"ExperienceExchange callback"
            )
        self._step = step
        self._reset_mailbox()

    def abandon_step(self) -> None:
        """Close the open step without accounting or storing it (a step that raised: nothing of it is kept)."""
        self._step = None
        self._reset_mailbox()

    def _require_open(self, what: str) -> int:
        if self._step is None:
            raise ExchangeProtocolError(f"{what}: no step is open; call begin_step(step) first")
        return self._step

    def publish(self, item: ScoredGroup | Sequence[Record], *, _replayed: bool = False) -> None:
        """Publish one group (or a list of records: rebuilt into groups; trace records are stored only)."""
        self._require_open("publish")
        if not isinstance(item, ScoredGroup):
            records = list(item)
            self._traces += [r for r in records if isinstance(r, TraceRecord)]
            for g in groups_from_records(records):
                self.publish(g, _replayed=_replayed)
            return
        check_group(item)
        if item.policy_id in self.replay_policies and not _replayed:
            raise ExchangeProtocolError(
                f"policy {item.policy_id!r} is replayed from {self.replay_dir}; the module must not publish it"
            )
        key = (item.policy_id, item.prompt_id, item.group_id)
        if key in self._keys:
            raise ExchangeProtocolError(
                f"step {self._step}: group (policy {key[0]!r}, prompt {key[1]}, group {key[2]}) published twice"
            )
        self._keys.add(key)
        self._published.setdefault(item.policy_id, []).append(item)

    def replay_groups(self, step: int, prompt_ids: Sequence[int]) -> dict[str, list[ScoredGroup]]:
        """Stored-peer mode: publish (once per step) and return each replayed policy's recorded groups of
        ``step``, checked against and ordered by the receiver batch's ``prompt_ids``. Opens ``step`` if no step
        is open. Raises ``StoredTrafficError`` / ``ReplayMismatchError`` (see ``replay.py``)."""
        if self._step is None:
            self.begin_step(step)
        if step != self._step:
            raise ExchangeProtocolError(f"replay_groups({step}) while step {self._step} is open")
        if self._replayed is None:
            out = {p: StoredPeer(self.replay_dir, p, cache=self._replay_cache).groups(step, prompt_ids)
                   for p in self.replay_policies}
            for groups in out.values():
                for g in groups:
                    self.publish(g, _replayed=True)
            self._replayed = out
        return {p: list(gs) for p, gs in self._replayed.items()}

    def _delivered_units(self, receiver: str) -> dict[str, int]:
        sub = self._subs[receiver]
        return {s: sum(len(g.rollouts) for g in gs) for s, gs in self._published.items() if sub.accepts(receiver, s)}

    def deliveries(self, receiver: str) -> dict[str, list[ScoredGroup]]:
        """The peers' groups delivered to ``receiver`` this step, by source (never its own)."""
        self._require_open("deliveries")
        if receiver not in self._subs:
            raise ExchangeProtocolError(
                f"receiver {receiver!r} never subscribed; call subscribe(receiver, kinds) at set-up "
                f"(kinds=set() for a regime that takes nothing)"
            )
        sub = self._subs[receiver]
        return {s: list(gs) for s, gs in self._published.items() if sub.accepts(receiver, s)}

    def report(self, receiver: str, source: str, consumed: int, dropped: dict[str, int] | None = None) -> None:
        """Account for the units of flow ``source->receiver`` this step: ``consumed`` plus ``dropped`` by reason."""
        self._require_open("report")
        if receiver not in self._subs:
            raise ExchangeProtocolError(f"report from receiver {receiver!r}, which never subscribed")
        counts = {"consumed": consumed, **{dropped_count(k): v for k, v in (dropped or {}).items()}}
        for k, v in counts.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"report {flow_name(source, receiver)}: {k} must be an int >= 0, got {v!r}")
            if k.startswith("dropped/") and not k[len("dropped/"):]:
                raise ValueError(f"report {flow_name(source, receiver)}: empty drop reason")
        self._reports.setdefault((source, receiver), Counter()).update(counts)

    def end_step(self) -> dict[str, float]:
        """Check this step's accounting, write the step file (``store_dir``), add to the totals and close the
        step; returns the per-step flow counts. Raises :class:`ExchangeAccountingError` listing every bad flow
        (the step then stays open and the totals are unchanged)."""
        step = self._require_open("end_step")
        flows: dict[str, Counter] = {}
        errors: list[str] = []
        for receiver, sub in self._subs.items():
            who = f"receiver {receiver!r}" + (f" (regime {sub.regime!r})" if sub.regime else "")
            for source, units in self._delivered_units(receiver).items():
                rep = self._reports.get((source, receiver))
                if rep is None:
                    errors.append(f"{who}: {units} units delivered from {source!r} were never reported")
                    continue
                drops = {k[len("dropped/"):]: v for k, v in rep.items() if k.startswith("dropped/")}
                accounted = rep["consumed"] + sum(drops.values())
                if accounted != units:
                    errors.append(
                        f"{who}, source {source!r}: delivered {units} but consumed {rep['consumed']} + dropped "
                        f"{drops} = {accounted}"
                    )
                flows[flow_name(source, receiver)] = Counter({"delivered": units, **rep})
        for (source, receiver), rep in self._reports.items():
            if flow_name(source, receiver) not in flows and sum(rep.values()) > 0:
                errors.append(
                    f"receiver {receiver!r}: reported {dict(rep)} from {source!r}, but nothing was delivered"
                )
        if agree_max([int(bool(errors))])[0] and not errors:  # several processes: fail together, never hang
            raise ExchangeAccountingError(f"SEE accounting failed at step {step} on another rank (see its error).")
        if errors:
            raise ExchangeAccountingError(
                f"SEE accounting failed at step {step} (every delivered record must be consumed or dropped with "
                f"a reason):\n  " + "\n  ".join(errors)
            )
        if self.store_dir:
            records = [r for gs in self._published.values() for g in gs for r in records_from_group(g)]
            # several processes: every rank trained its own prompts; the writer stores all ranks' traffic (in rank
            # order), so nothing a rank published is missing from the step file
            parts = gather_to_zero((records + self._traces, {f: dict(c) for f, c in flows.items()}))
            if self.is_writer and parts is not None:
                merged: dict[str, Counter] = {}
                for _, part_flows in parts:
                    for f, c in part_flows.items():
                        merged.setdefault(f, Counter()).update(c)
                write_step(self.store_dir, step, [r for rs, _ in parts for r in rs],
                           {f: dict(c) for f, c in merged.items()}, run_id=self.run_id)
        metrics = {published(s): float(sum(len(g.rollouts) for g in gs)) for s, gs in self._published.items()}
        for f, c in flows.items():
            metrics.update({exchange_name(f, k): float(v) for k, v in c.items()})
            self._totals.setdefault(f, Counter()).update(c)
        self._steps_ended += 1
        self._last_step = step
        self._step = None
        self._reset_mailbox()
        return metrics

    # ------------------------------------------------------------------------------------------ totals
    def totals(self) -> dict[str, dict[str, int]]:
        """Cumulative counts per flow (``delivered``, ``consumed``, ``dropped/<reason>``) over all ended steps."""
        return {f: dict(c) for f, c in self._totals.items()}

    def state_dict(self) -> dict:
        return {
            "version": STATE_VERSION,
            "totals": self.totals(),
            "steps_ended": self._steps_ended,
            "last_step": self._last_step,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict.get("version") != STATE_VERSION:
            raise ValueError(f"ExperienceExchange state version {state_dict.get('version')!r} != {STATE_VERSION}")
        self._totals = {f: Counter(c) for f, c in state_dict["totals"].items()}
        self._steps_ended = int(state_dict["steps_ended"])
        self._last_step = state_dict["last_step"]
