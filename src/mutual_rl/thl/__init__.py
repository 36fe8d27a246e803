"""Tokenizer Heterogeneity Layer (docs/methods.md §2): retokenization, trace alignment, residual report."""

from mutual_rl.thl.align import GRANULARITIES, AlignmentGroup, align_trace, align_traces, alignment_groups
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
