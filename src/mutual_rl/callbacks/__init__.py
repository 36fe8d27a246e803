"""Lightning callbacks of mutual-rl.

``ResourceAllocation`` (MWRA) lives here; the SEE callback is ``mutual_rl.exchange.ExperienceExchange``
(re-exported).
"""

from mutual_rl.callbacks.allocation import ResourceAllocation
from mutual_rl.exchange import ExperienceExchange

__all__ = ["ExperienceExchange", "ResourceAllocation"]
