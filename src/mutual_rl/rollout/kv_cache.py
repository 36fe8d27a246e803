"""A key/value cache for ``generate`` that writes each step into buffers allocated once per call.

Hugging Face's default ``DynamicCache`` concatenates every new key and value onto the old ones, so each decoding
step copies the whole cache and allocates a new one (quadratic in the response length; on the tiny CPU policies
with 128-token responses the copies were about half of a decoding step). :class:`PreallocatedLayer` allocates
``[batch, heads, capacity, head_dim]`` once, at the prefill, writes each step's keys and values in place and
returns views of the filled part, so attention sees exactly the tensors it saw before (same values; sampled tokens
and log-probs are identical, tested).

Only full-attention layers are replaced (:func:`preallocated_cache`); sliding-window, chunked, linear-attention
and other layer types keep Hugging Face's own classes. A write past the capacity grows the buffers (doubling), so a
wrong capacity costs speed, never correctness; cache surgery (``crop``, ``batch_select_indices``, beam reordering)
re-buffers the result.
"""

from __future__ import annotations

from functools import partial

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """A full-attention cache layer backed by buffers of ``capacity`` positions (grown if exceeded)."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = max(1, int(capacity))
        self._k = self._v = None
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._allocate(key_states, value_states, max(self.capacity, key_states.shape[-2]))
        self.length = 0
        self.keys, self.values = self._k[:, :, :0], self._v[:, :, :0]

    def _allocate(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        b, h, _, d = keys.shape
        self._k = keys.new_empty(b, h, capacity, d)
        self._v = values.new_empty(b, h, capacity, values.shape[-1])
        self.capacity = capacity

    def _adopt(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Copy ``keys``/``values`` (the whole cached sequence) into fresh buffers."""
        self._allocate(keys, values, max(self.capacity, keys.shape[-2]))
        self.length = 0
        self._write(keys, values)

    def _write(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        end = self.length + keys.shape[-2]
        self._k[:, :, self.length:end].copy_(keys)
        self._v[:, :, self.length:end].copy_(values)
        self.length = end
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            old_k, old_v = self.keys, self.values
            self.capacity = max(end, 2 * self.capacity)
            self._adopt(old_k, old_v)
        self._write(key_states, value_states)
        return self.keys, self.values

    def reset(self) -> None:
        self._k = self._v = None
        self.length = 0
        super().reset()

    def _rebuffer_after(self, op, *args) -> None:
        getattr(super(), op)(*args)
        if self.is_initialized and self.keys is not None and self.keys.numel():
            self._adopt(self.keys, self.values)

    def crop(self, tokens_to_remove: int) -> None:
        self._rebuffer_after("crop", tokens_to_remove)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._rebuffer_after("batch_repeat_interleave", repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._rebuffer_after("batch_select_indices", indices)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._rebuffer_after("reorder_cache", beam_idx)


def preallocated_cache(model, capacity: int) -> DynamicCache:
    """A ``DynamicCache`` for ``model`` (a Hugging Face model or its peft wrapper) whose full-attention layers are
    :class:`PreallocatedLayer` of ``capacity`` positions (prompt width + new tokens)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cache = DynamicCache(config=base.config)
    if cache.layers:
        cache.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer
                        for layer in cache.layers]
    else:  # layers created lazily, one per attention layer
        cache.layer_class_to_replicate = partial(PreallocatedLayer, capacity)
    return cache
