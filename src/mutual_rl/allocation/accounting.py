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

    def metrics(self, prefix: str = "alloc") -> dict[str, float]:
        """``<prefix>/<policy>/<field>_total`` for every policy and field."""
        return {f"{prefix}/{name}/{k}_total": float(v) for name, u in self.totals.items() for k, v in asdict(u).items()}

    def state_dict(self) -> dict:
        return {name: asdict(u) for name, u in self.totals.items()}

    def load_state_dict(self, state: dict) -> None:
        self.totals = {name: PolicyUsage(**u) for name, u in state.items()}


def step_usage(
    metrics: dict[str, float], name: str, *, num_prompts: int, n: int, updated: bool, devices: int, ranks: int = 1,
) -> PolicyUsage:
    """One step's usage of policy ``name`` from the module's logged metrics (``<name>/<key>``).

    Reads ``generated_tokens`` (response tokens sampled this step, every rollout included, such as DAPO dynamic
    sampling's extra rounds; without it: ``response_length`` x ``n`` x ``num_prompts``), ``gen_s`` (or
    ``gen_tokens_per_s``), ``trained_tokens`` and ``train_s`` (or ``train_tokens_per_s``). Seconds derived from a
    throughput are exact inversions of how the module computes it; a missing metric counts 0. ``num_prompts``: all
    ranks' prompts; ``ranks``: the number of processes whose per-rank means ``generated_tokens`` and
    ``trained_tokens`` the metrics hold (total = mean x ranks).
    """
    def get(key: str) -> float:
        v = metrics.get(f"{name}/{key}")
        return float(v) if v is not None else 0.0

    if f"{name}/generated_tokens" in metrics:
        generated = get("generated_tokens") * ranks
    else:
        generated = get("response_length") * n * num_prompts
    gen_s = get("gen_s") if f"{name}/gen_s" in metrics else _seconds(generated, get("gen_tokens_per_s"))
    trained = get("trained_tokens") * ranks if updated else 0.0
    if not updated:
        train_s = 0.0
    elif f"{name}/train_s" in metrics:
        train_s = get("train_s")
    else:
        train_s = _seconds(trained, get("train_tokens_per_s"))
    wall = gen_s + train_s
    return PolicyUsage(generated_tokens=generated, trained_tokens=trained, wall_s=wall, device_s=wall * devices,
                       steps=1, updates=int(updated))


def _seconds(tokens: float, per_s: float) -> float:
    return tokens / per_s if per_s > 0 else 0.0
