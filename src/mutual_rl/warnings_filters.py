"""Lightning warnings that do not apply to mutual-rl, silenced when a fit starts (never at import).

* "resuming from a checkpoint that ended before the epoch ended": the data module resumes its prompt stream
  itself (``mark_consumed`` / ``state_dict``);
* "overridden `transfer_batch_to_device`": prompts are text, tensors are built per policy on its own device;
* "Your `IterableDataset` has `__len__` defined": the prompt stream is read by one process;
* "Using ModelCheckpoint with manual optimization": every training step is one ``global_step`` here.

:func:`ignore_inapplicable_warnings` is called from ``MutualRLModule.setup``, so importing the package changes no
global warning filter; calling it again adds no duplicate filter.
"""

from __future__ import annotations

import warnings

INAPPLICABLE_WARNINGS = (
    r".*resuming from a checkpoint that ended before the epoch ended.*",
    r".*overridden `transfer_batch_to_device` in `LightningModule`.*",
    r".*Your `IterableDataset` has `__len__` defined.*",
    r".*Using ModelCheckpoint with manual optimization.*",
)


def ignore_inapplicable_warnings() -> None:
    """Add an ``ignore`` filter for each message of :data:`INAPPLICABLE_WARNINGS` (idempotent)."""
    for msg in INAPPLICABLE_WARNINGS:
        warnings.filterwarnings("ignore", message=msg)
