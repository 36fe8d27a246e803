"""Shared Experience Exchange (SEE, docs/methods.md §3): record kinds, the bus (a Lightning callback), stored traffic and
stored-peer replay.

* ``records.py``  -- record kinds (``Rollout`` from ``mutual_rl.types``, ``RewardRecord``, ``AdvantageRecord``,
  ``TraceRecord``), the exact ``ScoredGroup`` <-> records conversion and ``trace_records`` (aligned traces of
  crossed responses);
* ``bus.py``      -- ``ExchangeBus``: publish/subscribe, per-flow drop accounting, totals;
* ``callback.py`` -- ``ExperienceExchange(ExchangeBus, Callback)``: hooks, logging, checkpointed totals;
* ``store.py``    -- one schema-versioned JSONL file per step, atomic writes, validated reads;
* ``lock.py``     -- the OS lock of a store folder: one recording run at a time, a folder being recorded not replayed;
* ``replay.py``   -- ``StoredPeer``: a peer's recorded groups (and aligned traces) by step, checked against the
  receiver's prompts.
"""

from mutual_rl.exchange.bus import (
    ExchangeAccountingError,
    ExchangeBus,
    ExchangeProtocolError,
    Subscription,
)
from mutual_rl.exchange.callback import ExperienceExchange
from mutual_rl.exchange.records import (
    GROUP_KINDS,
    RECORD_KINDS,
    AdvantageRecord,
    Record,
    RewardRecord,
    Rollout,
    TraceRecord,
    groups_from_records,
    record_kind,
    records_from_group,
    trace_records,
)
from mutual_rl.exchange.replay import ReplayMismatchError, StoredPeer
from mutual_rl.exchange.store import (
    SCHEMA_VERSION,
    StoredTrafficError,
    read_step,
    step_path,
    stored_steps,
    write_step,
)

__all__ = [
    "GROUP_KINDS",
    "RECORD_KINDS",
    "SCHEMA_VERSION",
    "AdvantageRecord",
    "ExchangeAccountingError",
    "ExchangeBus",
    "ExchangeProtocolError",
    "ExperienceExchange",
    "Record",
    "ReplayMismatchError",
    "RewardRecord",
    "Rollout",
    "StoredPeer",
    "StoredTrafficError",
    "Subscription",
    "TraceRecord",
    "groups_from_records",
    "read_step",
    "record_kind",
    "records_from_group",
    "step_path",
    "stored_steps",
    "trace_records",
    "write_step",
]
