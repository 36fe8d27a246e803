"""Sharing regimes (docs/methods.md §5): registered by name, one interface (:class:`Regime`).

Importing this package registers every built-in regime (``none`` lives in ``base``; the others in their own
modules); :func:`get_regime` resolves a name.
"""

import inspect

from mutual_rl.regimes import graft, hacpo, prp, sgt, xgrpo  # noqa: F401 (each registers its regime)
from mutual_rl.regimes.base import (
    _REGIMES,
    NLLTerm,
    Regime,
    TrainingPlan,
    own_batch,
    register_regime,
    split_rows,
)


def get_regime(name: str, **kwargs) -> Regime:
    """A new instance of regime ``name`` with its keyword arguments; bad names or arguments are one clear error."""
    if name not in _REGIMES:
        raise ValueError(f"Unknown regime {name!r}; choose one of: {', '.join(sorted(_REGIMES))}.")
    cls = _REGIMES[name]
    params = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise ValueError(f"regime {name!r} got unknown arguments {unknown}; it takes: {', '.join(params) or 'none'}.")
    return cls(**kwargs)


def available_regimes() -> list[str]:
    """Sorted names of the registered regimes."""
    return sorted(_REGIMES)


__all__ = [
    "NLLTerm", "Regime", "TrainingPlan", "available_regimes", "get_regime", "own_batch", "register_regime",
    "split_rows",
]
