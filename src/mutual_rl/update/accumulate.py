"""Token-weighted sums of one mini-batch's (or one update's) objective statistics (``update/loop.py``)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from mutual_rl.stats import ObjectiveStats, TokenStats

_PARTS = ("rows", "own", "peer")
_TOKEN_FIELDS = tuple(f.name for f in dataclasses.fields(TokenStats) if f.name != "num_tokens")


@dataclass
class _MiniBatchResult:
    """Forward/backward passes: token-weighted sums of the objective's statistics per (row set, statistic), loss,
    NLL, tokens, and whether everything was finite.

    Values may be device tensors: they wait (``pending``) until :meth:`settle` reads all of them in one transfer and
    adds them in the order they came (the same float sums as reading each at once), so a mini-batch's update costs
    one host sync however many micro-batches it has. Read ``sums``, ``loss``, ``nll``, ``tokens`` and ``finite``
    after :meth:`settle`."""

    sums: dict[tuple[str, str], float] = field(default_factory=dict)
    weights: dict[tuple[str, str], float] = field(default_factory=dict)
    loss: float = 0.0
    nll: float = 0.0
    tokens: float = 0.0
    finite: bool = True
    pending: list[tuple] = field(default_factory=list)

    def add(self, key: tuple[str, str], value, weight) -> None:
        self.pending.append(("stat", key, value, weight))

    def add_loss(self, loss: torch.Tensor) -> None:
        """A micro-batch's loss: summed into ``loss``; a non-finite one makes ``finite`` False."""
        self.pending.append(("loss", loss.detach()))

    def add_nll(self, mean_nll, rows: int, of_rows: int) -> None:
        """The mean NLL of ``rows`` of the mini-batch's ``of_rows`` NLL rows (its share of their mean)."""
        self.pending.append(("nll", mean_nll, rows, of_rows))

    def add_tokens(self, num_tokens) -> None:
        self.pending.append(("tokens", num_tokens))

    def add_stats(self, stats: ObjectiveStats, num_tokens) -> None:
        """One micro-batch's statistics: all rows weighted by its ``num_tokens``, own and peer rows by theirs."""
        for part in _PARTS:
            values = getattr(stats, part)
            if values is None:
                continue
            weight = num_tokens if part == "rows" else values.num_tokens
            for name in _TOKEN_FIELDS:
                v = getattr(values, name)
                if v is not None:
                    self.add((part, name), v, weight)

    def settle(self, *extra: torch.Tensor) -> list[float]:
        """Read every pending value (and ``extra``) in one transfer, add them in order; returns ``extra`` as floats."""
        tensors: dict[int, torch.Tensor] = {}
        for entry in self.pending:
            for v in entry[2:] if entry[0] == "stat" else entry[1:2]:
                if isinstance(v, torch.Tensor):
                    tensors.setdefault(id(v), v)
        for v in extra:
            tensors.setdefault(id(v), v)
        read = {}
        if tensors:  # on the first value's device (a statistic made on the CPU joins with a host-to-device copy)
            device = next(iter(tensors.values())).device
            values = torch.stack([t.detach().reshape(()).to(device=device, dtype=torch.float64)
                                  for t in tensors.values()]).tolist()
            read = dict(zip(tensors, values))

        def val(v):
            return read[id(v)] if isinstance(v, torch.Tensor) else float(v)

        for entry in self.pending:
            kind = entry[0]
            if kind == "stat":
                key, value, weight = entry[1], val(entry[2]), val(entry[3])
                self.sums[key] = self.sums.get(key, 0.0) + value * weight
                self.weights[key] = self.weights.get(key, 0.0) + weight
            elif kind == "loss":
                value = val(entry[1])
                self.finite &= math.isfinite(value)
                self.loss += value
            elif kind == "nll":
                self.nll += val(entry[1]) * entry[2] / entry[3]
            else:
                self.tokens += val(entry[1])
        self.pending = []
        return [val(v) for v in extra]

    def absorb(self, other: _MiniBatchResult) -> None:
        """Add a mini-batch whose optimizer step was taken (its per-token means, weighted by its tokens)."""
        for key in other.sums:
            w = other.weights[key]
            self.sums[key] = self.sums.get(key, 0.0) + (other.sums[key] / w if w else 0.0) * w
            self.weights[key] = self.weights.get(key, 0.0) + w
        self.tokens += other.tokens

    def stats(self) -> ObjectiveStats | None:
        """The token-weighted means (``None`` when no token was trained; a row set without tokens is ``None``)."""
        parts: dict[str, dict[str, float]] = {}
        for (part, name), total in self.sums.items():
            if self.weights[(part, name)] > 0:
                parts.setdefault(part, {})[name] = total / self.weights[(part, name)]
        if not parts:
            return None
        return ObjectiveStats(rows=TokenStats(**parts.get("rows", {})),
                              own=TokenStats(**parts["own"]) if "own" in parts else None,
                              peer=TokenStats(**parts["peer"]) if "peer" in parts else None)
