"""MWRA: pure budget planning (:mod:`.plan`) and per-policy accounting (:mod:`.accounting`).

The Lightning side is :class:`mutual_rl.callbacks.ResourceAllocation`.
"""

from mutual_rl.allocation.accounting import Accounting, PolicyUsage, step_usage
from mutual_rl.allocation.plan import (
    COLOCATE,
    MODES,
    Budget,
    apportion,
    plan_budgets,
    update_ema,
    validate_budgets,
    validate_placement,
    validate_schedule,
)

__all__ = [
    "COLOCATE", "MODES", "Accounting", "Budget", "PolicyUsage", "apportion", "plan_budgets", "step_usage",
    "update_ema", "validate_budgets", "validate_placement", "validate_schedule",
]
