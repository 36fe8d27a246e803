"""Sampled log-probs read column-wise from vLLM's flat log-probs (rollout/vllm_records.py): the same values as the
per-token reading of the nested form, a position whose first entry is another token refused; and, where vLLM is
installed (the vllm lane), on vLLM's own ``FlatLogprobs`` built as its output processor builds it."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from mutual_rl.rollout.vllm_records import sampled_logprob, sampled_logprobs


@dataclass
class Columns:
    """vLLM's FlatLogprobs column layout (vllm/logprobs.py): per position [start, end) into flat columns."""

    start_indices: list[int] = field(default_factory=list)
    end_indices: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def add(self, entries: list[tuple[int, float]]) -> None:
        self.start_indices.append(len(self.token_ids))
        for t, lp in entries:
            self.token_ids.append(t)
            self.logprobs.append(lp)
        self.end_indices.append(len(self.token_ids))


def test_flat_columns_give_the_nested_values():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (300,), generator=g).tolist()
    values = (-torch.rand(300, generator=g) * 5).tolist()
    flat, nested = Columns(), []
    for t, v in zip(ids, values):
        flat.add([(t, v), (t + 1, v - 1.0)])  # the sampled token first, then a top-k entry
        nested.append({t: v, t + 1: v - 1.0})
    got = sampled_logprobs(flat, ids)
    want = sampled_logprobs(nested, ids)
    assert got.dtype == torch.float32 and got.shape == (300,)
    assert torch.equal(got, want)
    assert torch.equal(want, torch.tensor([sampled_logprob(e, t) for e, t in zip(nested, ids)], dtype=torch.float32))


def test_flat_columns_with_another_first_token_are_refused():
    flat = Columns()
    flat.add([(5, -0.1)])
    flat.add([(9, -0.2)])
    with pytest.raises(ValueError, match="sampled token"):
        sampled_logprobs(flat, [5, 7])
    with pytest.raises(ValueError, match="sampled token"):
        sampled_logprobs(flat, [5])


@pytest.mark.vllm  # run by the vllm lane (pytest -m vllm), where vllm is installed
def test_vllms_own_flat_logprobs():
    logprobs = pytest.importorskip("vllm.logprobs")
    flat = logprobs.create_sample_logprobs(flat_logprobs=True)
    ids, values = [11, 40, 7], [-0.25, -1.5, -3.0]
    for t, v in zip(ids, values):  # logprobs=0: the sampled token alone, with its rank
        logprobs.append_logprobs_for_next_position(flat, [t], [v], [None], 3, 0)
    assert type(flat).__name__ == "FlatLogprobs"
    assert sampled_logprobs(flat, ids).tolist() == values
