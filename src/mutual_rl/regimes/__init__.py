"""Sharing regimes (METHODS §5): registered by name, one interface."""

from mutual_rl.regimes.base import Regime, TrainingPlan, available_regimes, get_regime, register_regime

__all__ = ["Regime", "TrainingPlan", "available_regimes", "get_regime", "register_regime"]
