"""Sharing regimes (docs/methods.md §5): registered by name, one interface (:class:`Regime`)."""

from mutual_rl.regimes.base import (
    NLLTerm,
    Regime,
    TrainingPlan,
    available_regimes,
    get_regime,
    own_batch,
    register_regime,
    split_rows,
)

__all__ = [
    "NLLTerm", "Regime", "TrainingPlan", "available_regimes", "get_regime", "own_batch", "register_regime",
    "split_rows",
]
