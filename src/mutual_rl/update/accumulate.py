"""Token-weighted sums of one mini-batch's (or one update's) objective statistics (``update/loop.py``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from mutual_rl.stats import ObjectiveStats, TokenStats, as_float

_PARTS = ("rows", "own", "peer")
_TOKEN_FIELDS = tuple(f.name for f in dataclasses.fields(TokenStats) if f.name != "num_tokens")


@dataclass
class _MiniBatchResult:
    """Forward/backward passes: token-weighted sums of the objective's statistics per (row set, statistic), loss,
    NLL, tokens, and whether everything was finite."""

    sums: dict[tuple[str, str], float] = field(default_factory=dict)
    weights: dict[tuple[str, str], float] = field(default_factory=dict)
    loss: float = 0.0
    nll: float = 0.0
    tokens: float = 0.0
    finite: bool = True

    def add(self, key: tuple[str, str], value: float, weight: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + value * weight
        self.weights[key] = self.weights.get(key, 0.0) + weight

    def add_stats(self, stats: ObjectiveStats, num_tokens: float) -> None:
        """One micro-batch's statistics: all rows weighted by its ``num_tokens``, own and peer rows by theirs."""
        for part in _PARTS:
            values = getattr(stats, part)
            if values is None:
                continue
            weight = num_tokens if part == "rows" else as_float(values.num_tokens)
            for name in _TOKEN_FIELDS:
                v = getattr(values, name)
                if v is not None:
                    self.add((part, name), as_float(v), weight)

    def absorb(self, other: _MiniBatchResult) -> None:
        """Add a mini-batch whose optimizer step was taken (its per-token means, weighted by its tokens)."""
        for key in other.sums:
            w = other.weights[key]
            self.add(key, other.sums[key] / w if w else 0.0, w)
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
