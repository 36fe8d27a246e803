"""Tokenizer Heterogeneity Layer (docs/methods.md §2): retokenization, trace alignment, residual report.

The entry points check their inputs (ids in the tokenizer's range, texts encodable as UTF-8) and raise one
:class:`THLInputError` naming the function, the argument and the fix (``checks.py``)."""

from mutual_rl.thl.align import GRANULARITIES, AlignmentGroup, align_trace, align_traces, alignment_groups
from mutual_rl.thl.checks import THLInputError
from mutual_rl.thl.offsets import encode_with_offsets, offsets_by_decoding
from mutual_rl.thl.residual import residual_report
from mutual_rl.thl.retokenize import (
    DecodedSource,
    Retokenized,
    decode_source,
    prompt_ids,
    retokenize,
    special_affixes,
)

__all__ = [
    "GRANULARITIES",
    "AlignmentGroup",
    "DecodedSource",
    "Retokenized",
    "THLInputError",
    "align_trace",
    "align_traces",
    "alignment_groups",
    "decode_source",
    "encode_with_offsets",
    "offsets_by_decoding",
    "prompt_ids",
    "residual_report",
    "retokenize",
    "special_affixes",
]
