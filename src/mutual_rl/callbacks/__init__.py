"""Lightning callbacks and plugins of mutual-rl.

``ResourceAllocation`` (MWRA) lives here, and ``AtomicCheckpointIO`` (the checkpoint plugin ``mutual-rl`` uses by
default); the SEE callback is ``mutual_rl.exchange.ExperienceExchange`` (re-exported).
"""

from mutual_rl.callbacks.allocation import ResourceAllocation
from mutual_rl.callbacks.checkpointing import AtomicCheckpointIO
from mutual_rl.exchange import ExperienceExchange

__all__ = ["AtomicCheckpointIO", "ExperienceExchange", "ResourceAllocation"]
