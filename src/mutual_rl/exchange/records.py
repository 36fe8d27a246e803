"""SEE record kinds and the exact conversion between a ``ScoredGroup`` and its records.

Four record kinds cross the Shared Experience Exchange (docs/methods.md §3). Every record carries explicit identity
(``policy_id`` = the producing policy, ``prompt_id``, ``group_id``, ``step``, ``policy_version``; docs/design.md, rule 4):

* ``"rollout"``   -- :class:`mutual_rl.types.Rollout` itself (prompt, response text, source token ids, per-token
  log-probs, char offsets, finish reason); it is reused here, not duplicated.
* ``"reward"``    -- :class:`RewardRecord`: the scalar reward of response ``index`` of a group, plus verifier info.
* ``"advantage"`` -- :class:`AdvantageRecord`: the source-computed GRPO advantage of response ``index``.
* ``"trace"``     -- :class:`TraceRecord`: a source response's log-prob trace aligned onto a *receiver's*
  tokenization (THL output, one value per receiver token). Traces are receiver-side derived records: after a
  receiver's plan the module publishes one per crossed response that carries an aligned trace
  (:func:`trace_records`; PRP ``denominator: peer_aligned``), and the bus stores them with the step's traffic but
  never delivers or accounts them (see ``bus.py``); ``StoredPeer.traces`` reads them back.

Regimes consume ``ScoredGroup``s, so :func:`records_from_group` / :func:`groups_from_records` convert exactly
(tensors included: values, dtype and shape). A group's rollouts keep their order; reward/advantage records carry
their position ``index`` in the group. Scalars are stored as Python floats, which hold every float16/bfloat16/
float32/float64 value exactly, together with the tensor's dtype name, so the round trip is bit-exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from mutual_rl.types import CrossedRollout, Rollout, ScoredGroup

RECORD_KINDS = ("rollout", "reward", "advantage", "trace")
"""All record kinds, in the order a group's records are emitted."""
GROUP_KINDS = frozenset({"rollout", "reward", "advantage"})
"""The kinds a receiver can subscribe to on the bus (they make up a ``ScoredGroup``)."""


@dataclass(frozen=True)
class RewardRecord:
    """Reward of one response (position ``index`` in its group) of ``policy_id``'s group for ``prompt_id``."""

    policy_id: str
    prompt_id: int
    group_id: int
    step: int
    policy_version: int
    index: int  # position of the response in its group, 0..n-1
    value: float  # the reward r_i (binary for verifiable tasks; any real value works)
    dtype: str = "float32"  # dtype of the group's rewards tensor (for an exact round trip)
    verifier: str = ""  # free-form verifier info (reward name, parse status, ...); "" when unknown


@dataclass(frozen=True)
class AdvantageRecord:
    """Source-computed GRPO advantage of response ``index`` of ``policy_id``'s group for ``prompt_id``."""

    policy_id: str
    prompt_id: int
    group_id: int
    step: int
    policy_version: int
    index: int  # position of the response in its group, 0..n-1
    value: float  # the advantage Â_i computed by the source over its own group
    dtype: str = "float32"  # dtype of the group's advantages tensor


@dataclass(frozen=True)
class TraceRecord:
    """The source log-prob trace of one response, aligned onto a receiver's tokens (THL, docs/methods.md §2.2).

    ``policy_id`` is the *source* policy; ``receiver_id`` the policy whose tokenization ``source_logp`` follows.
    """

    policy_id: str
    prompt_id: int
    group_id: int
    step: int
    policy_version: int
    index: int  # position of the response in the source group
    receiver_id: str
    source_logp: torch.Tensor  # [T_R] float, aligned source log-prob per receiver response token


Record = Rollout | RewardRecord | AdvantageRecord | TraceRecord


def trace_records(crossed: Iterable[CrossedRollout], groups: Iterable[ScoredGroup]) -> list[TraceRecord]:
    """One :class:`TraceRecord` per crossed response that carries an aligned trace (``aligned``), in order.

    ``groups``: the peer groups the crossed responses come from (the receiver's deliveries); each response's
    ``index`` is its position in its source group, found by identity (the regime crosses the delivered records
    themselves). Raises ``ValueError`` for an aligned response that is in none of ``groups``."""
    where = {id(r): i for g in groups for i, r in enumerate(g.rollouts)}
    out = []
    for c in crossed:
        if not c.aligned:
            continue
        src = c.source
        if id(src) not in where:
            raise ValueError(f"crossed response of policy {src.policy_id!r} (prompt {src.prompt_id}, group "
                             f"{src.group_id}) for receiver {c.receiver_id!r} is in none of the given groups")
        out.append(TraceRecord(src.policy_id, src.prompt_id, src.group_id, src.step, src.policy_version,
                               where[id(src)], c.receiver_id, c.source_logp))
    return out


def record_kind(record: Record) -> str:
    """The kind name (``"rollout"``, ``"reward"``, ``"advantage"``, ``"trace"``) of a record."""
    for cls, kind in _KIND_OF.items():
        if isinstance(record, cls):
            return kind
    raise TypeError(f"not an exchange record: {type(record).__name__} (kinds: {', '.join(RECORD_KINDS)})")


_KIND_OF = {Rollout: "rollout", RewardRecord: "reward", AdvantageRecord: "advantage", TraceRecord: "trace"}


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown tensor dtype {name!r}")
    return dt


def check_group(group: ScoredGroup) -> None:
    """Raise ``ValueError`` if a group's identity or sizes are inconsistent (nothing is inferred from layout)."""
    n = len(group.rollouts)
    where = f"group (policy {group.policy_id!r}, prompt {group.prompt_id}, group {group.group_id})"
    if n == 0:
        raise ValueError(f"{where} has no rollouts")
    if tuple(group.rewards.shape) != (n,) or tuple(group.advantages.shape) != (n,):
        raise ValueError(
            f"{where}: {n} rollouts but rewards {tuple(group.rewards.shape)} and advantages "
            f"{tuple(group.advantages.shape)}; both must be [{n}]"
        )
    for i, r in enumerate(group.rollouts):
        if (r.policy_id, r.prompt_id, r.group_id) != (group.policy_id, group.prompt_id, group.group_id):
            raise ValueError(
                f"{where}: rollout {i} has identity (policy {r.policy_id!r}, prompt {r.prompt_id}, "
                f"group {r.group_id})"
            )


def records_from_group(group: ScoredGroup, verifier: str = "") -> list[Record]:
    """A group's records: its ``n`` rollouts in order, then ``n`` reward records, then ``n`` advantage records."""
    check_group(group)
    rd, ad = dtype_name(group.rewards), dtype_name(group.advantages)
    rewards, advs = group.rewards.tolist(), group.advantages.tolist()
    out: list[Record] = list(group.rollouts)
    ids = [(group.policy_id, group.prompt_id, group.group_id, r.step, r.policy_version) for r in group.rollouts]
    out += [RewardRecord(*ids[i], i, rewards[i], rd, verifier) for i in range(len(ids))]
    out += [AdvantageRecord(*ids[i], i, advs[i], ad) for i in range(len(ids))]
    return out


def groups_from_records(records: Iterable[Record]) -> list[ScoredGroup]:
    """Rebuild the ``ScoredGroup``s of a record stream (inverse of :func:`records_from_group`).

    Groups are keyed by ``(policy_id, prompt_id, group_id)`` and returned in order of first appearance; a
    group's rollouts keep their stream order; reward/advantage records are placed by ``index``. Trace records
    are ignored (they are not part of a group). Raises ``ValueError`` naming the group when a group is incomplete
    (missing or duplicate reward/advantage, no rollouts).
    """
    rollouts: dict[tuple, list[Rollout]] = {}
    scalars: dict[tuple, dict[str, dict[int, RewardRecord | AdvantageRecord]]] = {}
    order: list[tuple] = []
    for rec in records:
        kind = record_kind(rec)
        if kind == "trace":
            continue
        key = (rec.policy_id, rec.prompt_id, rec.group_id)
        if key not in scalars:
            order.append(key)
            scalars[key] = {"reward": {}, "advantage": {}}
            rollouts[key] = []
        if kind == "rollout":
            rollouts[key].append(rec)
        else:
            slot = scalars[key][kind]
            if rec.index in slot:
                raise ValueError(f"duplicate {kind} record for index {rec.index} of group {_name(key)}")
            slot[rec.index] = rec
    return [_build(key, rollouts[key], scalars[key]) for key in order]


def _name(key: tuple) -> str:
    return f"(policy {key[0]!r}, prompt {key[1]}, group {key[2]})"


def _build(key: tuple, rollouts: Sequence[Rollout], scalars: dict) -> ScoredGroup:
    n = len(rollouts)
    if n == 0:
        raise ValueError(f"group {_name(key)} has reward/advantage records but no rollout records")
    tensors = []
    for kind in ("reward", "advantage"):
        slot = scalars[kind]
        if sorted(slot) != list(range(n)):
            raise ValueError(
                f"group {_name(key)} has {n} rollouts but {kind} records for indices {sorted(slot)}; "
                f"expected exactly 0..{n - 1}"
            )
        dtypes = {r.dtype for r in slot.values()}
        if len(dtypes) != 1:
            raise ValueError(f"group {_name(key)}: {kind} records disagree on dtype: {sorted(dtypes)}")
        tensors.append(torch.tensor([slot[i].value for i in range(n)], dtype=dtype_from_name(dtypes.pop())))
    return ScoredGroup(key[0], key[1], key[2], tuple(rollouts), tensors[0], tensors[1])
