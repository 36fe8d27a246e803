"""Sharing regimes (docs/methods.md §5): registered by name, one interface (:class:`Regime`).

Importing this package registers every built-in regime (``none`` lives in ``base``; the others in their own
modules); :func:`get_regime` resolves a name.
"""

import inspect

from mutual_rl.regimes.base import _REGIMES, NoSharing, Regime, own_batch, register_regime, split_rows
from mutual_rl.regimes.ftis import FTIS
from mutual_rl.regimes.graft import GRAFT
from mutual_rl.regimes.hacpo import HACPO
from mutual_rl.regimes.prp import PRP
from mutual_rl.regimes.sgt import SGT
from mutual_rl.regimes.xgrpo import XGRPO
from mutual_rl.types import NLLTerm, TrainingPlan


def get_regime(name: str, **kwargs) -> Regime:
    """A new instance of regime ``name`` with its keyword arguments; bad names or arguments are one clear error."""
    cls = regime_class(name)
    params = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise ValueError(f"regime {name!r} got unknown arguments {unknown}; it takes: {', '.join(params) or 'none'}.")
    return cls(**kwargs)


def regime_class(name: str) -> type[Regime]:
    """The class registered under ``name`` (``ValueError`` naming the registered ones otherwise)."""
    if name not in _REGIMES:
        raise ValueError(f"Unknown regime {name!r}; choose one of: {', '.join(sorted(_REGIMES))}.")
    return _REGIMES[name]  # type: ignore[return-value]


def as_regime(regime: Regime | str) -> Regime:
    """``regime`` itself, or a new instance of the regime registered under that name (default arguments)."""
    if isinstance(regime, Regime):
        return regime
    if isinstance(regime, str):
        return get_regime(regime)
    raise TypeError(f"a regime must be a Regime instance (class_path/init_args in a config) or a registered name "
                    f"({', '.join(sorted(_REGIMES))}), got {regime!r}.")


def regime_name(regime: Regime) -> str:
    """The registered name of ``regime``'s class (or of the registered class it derives from; else its class
    name)."""
    for cls in type(regime).__mro__:
        for name, registered in _REGIMES.items():
            if registered is cls:
                return name
    return type(regime).__name__


def require_a_peer(spec, regime: Regime) -> None:
    """A single policy trained with a sharing regime (one that reads peers' records) and no replayed peer has
    nothing to learn from: one error naming the regime and the fixes."""
    if regime.subscribes:
        where = "model.policies[0].regime" if spec.regime else "model.regime"
        raise ValueError(
            f"{where} is {regime_name(regime)!r}, a sharing regime, but model.policies has the single policy "
            f"{spec.name!r}: it has no peer to learn from. Add a second policy, replay a recorded peer "
            f"(ExperienceExchange replay_dir/replay_policies), or set {where}: none.")


def available_regimes() -> list[str]:
    """Sorted names of the registered regimes."""
    return sorted(_REGIMES)


__all__ = [
    "FTIS", "GRAFT", "HACPO", "PRP", "SGT", "XGRPO", "NoSharing",
    "NLLTerm", "Regime", "TrainingPlan", "as_regime", "available_regimes", "get_regime", "own_batch",
    "regime_class", "regime_name", "register_regime", "require_a_peer", "split_rows",
]
