"""MWRA accounting: cumulative per-policy resource totals, checkpointed with the callback (docs/design.md, rule 11).

Per policy and step: ``generated_tokens`` (response tokens sampled, extra rollouts included), ``trained_tokens``
(response tokens that went through forward/backward in the update; 0 on a step the policy does not update),
``wall_s`` (rollout + update seconds) and ``device_s`` (``wall_s`` times the number of devices that served the
policy: every device of the trainer for a colocated policy, 1 for a policy placed on one device). ``steps`` and
``updates`` count steps seen and steps the policy updated. Totals are plain floats/ints: ``state_dict`` /
``load_state_dict`` continue them exactly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from mutual_rl.names import alloc_total
from mutual_rl.stats import Usage


@dataclass
class PolicyUsage:
    generated_tokens: float = 0.0
    trained_tokens: float = 0.0
    wall_s: float = 0.0
    device_s: float = 0.0
    steps: int = 0
    updates: int = 0

    def add(self, other: PolicyUsage) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class Accounting:
    """Per-policy cumulative :class:`PolicyUsage`."""

    def __init__(self) -> None:
        self.totals: dict[str, PolicyUsage] = {}

    def add(self, name: str, usage: PolicyUsage) -> None:
        self.totals.setdefault(name, PolicyUsage()).add(usage)

    def metrics(self) -> dict[str, float]:
        """``alloc/<policy>/<field>_total`` for every policy and field (:func:`mutual_rl.names.alloc_total`)."""
        return {alloc_total(name, k): float(v) for name, u in self.totals.items() for k, v in asdict(u).items()}

    def state_dict(self) -> dict:
        return {name: asdict(u) for name, u in self.totals.items()}

    def load_state_dict(self, state: dict) -> None:
        self.totals = {name: PolicyUsage(**u) for name, u in state.items()}


def step_usage(usage: Usage, *, devices: int, ranks: int = 1) -> PolicyUsage:
    """One step's usage of a policy from its step report's :class:`~mutual_rl.stats.Usage` (its sampling and update,
    reduced over ranks: per-rank means). ``ranks``: the number of processes, each of which sampled and trained its
    own prompts, so the totals are the means times the ranks; ``devices``: the devices that served the policy."""
    wall = usage.gen_s + usage.train_s
    return PolicyUsage(generated_tokens=usage.generated_tokens * ranks, trained_tokens=usage.trained_tokens * ranks,
                       wall_s=wall, device_s=wall * devices, steps=1, updates=int(usage.updated))
