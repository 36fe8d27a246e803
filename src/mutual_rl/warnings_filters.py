"""Lightning warnings that do not apply to mutual-rl, silenced when a fit starts (never at import), and the one
about ``trainer.precision`` that does (:func:`warn_on_true_half_precision`).

* "resuming from a checkpoint that ended before the epoch ended": the data module resumes its prompt stream
  itself (``mark_consumed`` / ``state_dict``);
* "overridden `transfer_batch_to_device`": prompts are text, tensors are built per policy on its own device;
* "Your `IterableDataset` has `__len__` defined": the prompt stream is read by one process;
* "Using ModelCheckpoint with manual optimization": every training step is one ``global_step`` here;
* "`isinstance(treespec, LeafSpec)` is deprecated": torch's deprecation of a class that Lightning's own pytree code
  uses on every step; nothing a user of mutual-rl can change.

And one message of transformers' logger (:class:`FinishedRowPadFilter`): "We strongly recommend passing in an
`attention_mask`". Our ``generate`` calls always pass the mask; transformers itself drops a mask of all ones (no
padded prompt) and then, on a decoding step, sees a finished row's pad token (GPT-2's pad is its EOS) with no mask.

:func:`ignore_inapplicable_warnings` is called from ``MutualRLModule.setup``, so importing the package changes no
global warning filter; calling it again adds no duplicate filter. Our own ``generate`` calls (the HF rollout engine
and greedy evaluation) also run inside :func:`finished_row_pad_alarm_silenced`, which adds the transformers filter
for the call only, so evaluations outside a fit (``scripts/preconditions.py``, a comparison's step 0) do not print
the false alarm either, and a user's own mask-less model calls outside a fit still get the warning.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager

INAPPLICABLE_WARNINGS = (
    r".*resuming from a checkpoint that ended before the epoch ended.*",
    r".*overridden `transfer_batch_to_device` in `LightningModule`.*",
    r".*Your `IterableDataset` has `__len__` defined.*",
    r".*Using ModelCheckpoint with manual optimization.*",
    r".*`isinstance\(treespec, LeafSpec\)` is deprecated.*",
)

#: the transformers logger that says "We strongly recommend passing in an `attention_mask`"
TRANSFORMERS_LOGGER = "transformers.modeling_utils"


class FinishedRowPadFilter(logging.Filter):
    """Drops transformers' "We strongly recommend passing in an `attention_mask`" record; keeps every other one."""

    MESSAGE = "We strongly recommend passing in an `attention_mask`"

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.MESSAGE)


def ignore_inapplicable_warnings() -> None:
    """Add an ``ignore`` filter for each message of :data:`INAPPLICABLE_WARNINGS` and a :class:`FinishedRowPadFilter`
    to transformers' logger (idempotent)."""
    for msg in INAPPLICABLE_WARNINGS:
        warnings.filterwarnings("ignore", message=msg)
    logger = logging.getLogger(TRANSFORMERS_LOGGER)
    if not any(isinstance(f, FinishedRowPadFilter) for f in logger.filters):
        logger.addFilter(FinishedRowPadFilter())


@contextmanager
def finished_row_pad_alarm_silenced():
    """Inside: transformers' logger has a :class:`FinishedRowPadFilter` (our ``generate`` calls always pass the
    attention mask); on exit the filter is removed again, unless it was there before (a fit's)."""
    logger = logging.getLogger(TRANSFORMERS_LOGGER)
    if any(isinstance(f, FinishedRowPadFilter) for f in logger.filters):
        yield
        return
    added = FinishedRowPadFilter()
    logger.addFilter(added)
    try:
        yield
    finally:
        logger.removeFilter(added)


TRUE_HALF_PRECISIONS = ("bf16-true", "16-true", "bf16", "16", "half")


def warn_on_true_half_precision(precision: str) -> None:
    """Warn when ``trainer.precision`` keeps the policies' weights in bfloat16/float16 with no float32 master copy:
    an optimizer step moves a weight only if it exceeds half its rounding step (2^-8 of the weight in bfloat16,
    2^-11 in float16), so at RL learning rates (~1e-6) most updates round away."""
    if precision in TRUE_HALF_PRECISIONS:
        bits = 8 if "bf16" in precision else 11
        warnings.warn(
            f"trainer.precision={precision!r} trains the policies' weights in half precision with no float32 master "
            f"copy: an update smaller than about 2^-{bits} of a weight rounds away (AdamW steps of ~lr, e.g. 1e-6, "
            "on weights of ~1e-2 mostly do). Use precision: bf16-mixed (float32 weights, bf16 compute; with "
            "MutualFSDPStrategy also mixed_precision: bf16).", UserWarning, stacklevel=2)
