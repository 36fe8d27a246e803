"""An objective that records its calls, for tests of what the update passes to the plan's objective."""

from __future__ import annotations

from dataclasses import dataclass, field

from mutual_rl.update.objectives import Objective, resolve


@dataclass
class Recording:
    """Runs ``inner`` (``None``: the algorithm's DAPO) and appends ``(update_index, micro-batch, stats)`` of every
    call to ``calls`` (shared by its completed copies)."""

    inner: Objective | None = None
    calls: list = field(default_factory=list)

    def with_algorithm(self, base) -> Recording:
        return Recording(resolve(self.inner, base), self.calls)

    def loss(self, logp, sub, norms, ref_logp=None, update_index=0):
        loss, stats = self.inner.loss(logp, sub, norms, ref_logp, update_index)
        self.calls.append((update_index, sub, stats))
        return loss, stats
