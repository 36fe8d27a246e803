"""Sampling without ``generate``: a decode loop over a preallocated key/value cache *(ours)*.

The HF engine's default sampler where it is measured faster (``HFRolloutEngine(sampler=...)``). It draws the same
tokens as transformers' ``generate`` does with the engine's ``GenerationConfig`` -- the same ids for the same torch
generator state, tested in float32 -- by doing what ``generate``'s sampling loop does, in the same order, and
nothing else:

1. **Prefill.** ``ids``/``attn`` ``[B, W]`` are left-padded prompts; position ids are ``cumsum(attn) - 1`` (0 on
   padding), the mask is dropped when it has no padding (as ``generate`` drops an all-ones mask), and the model is
   called with ``logits_to_keep=1``. With ``prefix`` (the engine's shared prompt prefill, a cache of every row's
   first ``W - 1`` prompt tokens) only the last prompt token runs, on that cache -- what ``generate`` does when
   given it.
2. **Each step** ``t = 0 .. T-1``: the last position's logits as float32; the EOS logit set to ``-inf`` while
   ``t < min_new_tokens`` (``generate``'s ``MinNewTokensLengthLogitsProcessor``); the sampling warpers --
   transformers' own ``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper`` in that order, each
   only when set (:func:`sampling_warpers`); ``torch.multinomial(softmax(scores), 1)`` over **all** ``B`` rows,
   so the global generator advances exactly as in ``generate`` (finished rows included); the token's log-prob
   under ``log_softmax(scores)`` (the engine's ``SampledLogProbs`` records the same); finished rows get
   ``pad_token_id``; a row finishes at its first EOS; the loop ends after ``T`` tokens or when every row has
   finished. The next step feeds the sampled tokens at the next position with the mask grown by ones.

What differs from ``generate`` is how, not what:

- the key/value cache of every layer is one buffer of ``[B, H, W + T, D]`` per keys and values, allocated at the
  first write, into which each step's keys and values are copied and whose filled prefix is handed to attention
  as a view (:class:`PreallocatedLayer`; ``generate``'s ``DynamicCache`` concatenates, copying the whole cache at
  every step of every layer);
- finished rows leave the batch: once at least an eighth of the rows still run (and at least one) have finished,
  the rest are moved to the front of the buffers (mask and positions alike) and only they run from then on, where
  ``generate`` runs every row to the end on padding. The draw still covers all ``B`` rows -- a dropped row's
  probabilities are a constant dummy whose token is discarded -- because the generator's consumption depends only
  on the shape of the tensor ``torch.multinomial`` draws from;
- none of ``generate``'s per-step machinery runs (input preparation, logits-processor and stopping-criteria lists,
  streamer, argument re-validation).

A row's logits computed over a view of a longer buffer, or in a smaller batch, can round differently from
``generate``'s (a matrix product's rounding may depend on its row count), so log-probs agree with ``generate``'s
to float rounding (within 2e-6 in the tests) and the token ids are the same unless a draw falls within that
rounding of a boundary between two tokens (never in the tests).

Runs eagerly. ``torch.compile`` of the decode step is not offered: on the CPU the step's cost is the model's
matrix products and the ``[B, V]`` sampling, which compiling does not shrink, and compiling takes longer than the
sampling of a whole short run. :func:`preallocated_cache` returns ``None`` -- the engine then calls ``generate`` --
for models whose cache is not plain full-attention key/value layers (sliding-window, linear-attention and hybrid
layers keep other state), and :func:`static_sample` needs a ``forward`` that takes ``position_ids`` and
``logits_to_keep``.
"""

from __future__ import annotations

import inspect

import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from mutual_rl.model.lm_head import base_model
from mutual_rl.model.spec import SamplingSpec


def sampling_warpers(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> LogitsProcessorList:
    """transformers' warpers for these settings in ``generate``'s order (temperature, top-k, top-p), each only when
    it changes something: what ``generate`` builds for them."""
    warpers = []
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
    return LogitsProcessorList(warpers)


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values live in buffers of ``capacity`` positions, allocated at the first
    write: each ``update`` copies the new states in place and ``keys``/``values`` are views of the filled prefix
    (so every ``DynamicLayer`` method that reads them -- lengths, mask sizes -- sees what a ``DynamicLayer``
    would)."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self._key_buf: torch.Tensor | None = None
        self._value_buf: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, dk = key_states.shape
        self._key_buf = key_states.new_empty((b, h, self.capacity, dk))
        self._value_buf = value_states.new_empty((b, value_states.shape[1], self.capacity, value_states.shape[-1]))
        self.keys, self.values = self._key_buf[:, :, :0], self._value_buf[:, :, :0]
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.keys.shape[-2], self.keys.shape[-2] + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"PreallocatedLayer holds {self.capacity} positions; {end} were written")
        self._key_buf[:, :, start:end].copy_(key_states)
        self._value_buf[:, :, start:end].copy_(value_states)
        self.keys, self.values = self._key_buf[:, :, :end], self._value_buf[:, :, :end]
        return self.keys, self.values

    def keep_rows(self, keep: torch.Tensor) -> None:
        """Only the batch rows ``keep`` stay: copied to the buffers' first ``len(keep)`` rows, which become the
        buffers (the memory is not released)."""
        n, length = len(keep), self.keys.shape[-2]
        self._key_buf[:n, :, :length] = self._key_buf[keep, :, :length]
        self._value_buf[:n, :, :length] = self._value_buf[keep, :, :length]
        self._key_buf, self._value_buf = self._key_buf[:n], self._value_buf[:n]
        self.keys, self.values = self._key_buf[:, :, :length], self._value_buf[:, :, :length]


def preallocated_cache(model, capacity: int) -> Cache | None:
    """A cache of :class:`PreallocatedLayer` of ``capacity`` positions, one per layer of ``model`` (a Hugging Face
    model or a wrapper of one), or ``None`` unless the model's own ``DynamicCache`` would consist of plain
    ``DynamicLayer``s only (no sliding-window, chunked, linear-attention or hybrid layers)."""
    config = getattr(base_model(model), "config", None)
    if config is None:
        return None
    try:
        layers = DynamicCache(config=config).layers
    except Exception:  # a config DynamicCache cannot read: let generate handle the model
        return None
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    return Cache(layers=[PreallocatedLayer(capacity) for _ in layers])


def supports_static_sample(model) -> bool:
    """Whether ``model``'s forward takes ``position_ids`` and ``logits_to_keep`` and its cache can be
    preallocated (:func:`preallocated_cache`)."""
    params = inspect.signature(base_model(model).forward).parameters
    return "position_ids" in params and "logits_to_keep" in params and preallocated_cache(model, 1) is not None


def static_sample(model, ids: torch.Tensor, attn: torch.Tensor, s: SamplingSpec, *, eos_token_id: int,
                  pad_token_id: int, min_new_tokens: int = 0, prefix: Cache | None = None):
    """``(tokens [B, steps], logp [B, steps])`` sampled from ``model`` for the left-padded ``ids``/``attn``
    ``[B, W]`` (on the model's device), as ``generate`` samples them (module docstring); ``steps`` <=
    ``s.max_new_tokens``, rows after their EOS hold ``pad_token_id``. ``prefix``: a cache of every row's first
    ``W - 1`` tokens (the shared prompt prefill). Call under ``torch.no_grad()`` with the model in eval mode."""
    b, width = ids.shape
    cache = preallocated_cache(model, width + s.max_new_tokens)
    if cache is None:
        raise ValueError("static_sample needs a model whose cache is plain key/value layers (supports_static_sample)")
    pos = (attn.long().cumsum(-1) - 1).masked_fill(attn == 0, 0)
    mask = None if bool((attn == 1).all()) else \
        torch.cat([attn.long(), attn.new_ones((b, s.max_new_tokens), dtype=torch.long)], dim=1)
    if prefix is not None:
        for mine, theirs in zip(cache.layers, prefix.layers):
            mine.update(theirs.keys, theirs.values)
        out = model(input_ids=ids[:, -1:], attention_mask=None if mask is None else mask[:, :width],
                    position_ids=pos[:, -1:], past_key_values=cache, use_cache=True, logits_to_keep=1)
    else:
        out = model(input_ids=ids, attention_mask=None if mask is None else mask[:, :width], position_ids=pos,
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
    logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
    del out
    return _decode(model, logits, cache, mask, pos[:, -1:], width, s, eos_token_id, pad_token_id, min_new_tokens)


def _decode(model, logits, cache, mask, last_pos, width, s: SamplingSpec, eos: int, pad: int, min_new: int):
    """The sampling loop of :func:`static_sample` from the prompt's last logits ``[B, V]`` (module docstring, 2).
    ``rows``: the rows of the batch still run through the model (finished ones are dropped, :func:`_keep_rows`)."""
    b, steps, eos = logits.shape[0], s.max_new_tokens, -1 if eos is None else eos  # -1: no EOS, rows never stop
    warpers = sampling_warpers(s.temperature, s.top_k, s.top_p)
    tokens = torch.full((b, steps), pad, dtype=torch.long, device=logits.device)
    logp = torch.zeros((b, steps), dtype=torch.float32, device=logits.device)
    rows = torch.arange(b, device=logits.device)
    running = torch.ones(b, dtype=torch.bool, device=logits.device)  # per row of ``rows``: not finished yet
    for t in range(steps):
        if t < min_new and eos >= 0:
            logits[:, eos] = float("-inf")
        scores = warpers(None, logits)
        probs = torch.softmax(scores, dim=-1)
        if len(rows) < b:  # dropped rows draw from a dummy distribution, so the generator advances as for B rows
            probs = probs.new_ones((b, probs.shape[1])).index_copy_(0, rows, probs)
        token = torch.multinomial(probs, num_samples=1)[rows]  # [rows, 1]
        logp[rows, t] = torch.log_softmax(scores, dim=-1).gather(-1, token).squeeze(-1)
        token = token.squeeze(-1).masked_fill(~running, pad)
        tokens[rows, t] = token
        running &= token != eos
        done = len(rows) - int(running.sum())
        if t + 1 == steps or done == len(rows):
            return tokens[:, : t + 1], logp[:, : t + 1]
        if done and done >= len(rows) // 8:  # drop the finished rows from the batch
            keep = running.nonzero().squeeze(-1)
            _keep_rows(cache, keep)
            rows, token, last_pos, running = rows[keep], token[keep], last_pos[keep], running[keep]
            mask = None if mask is None else mask[keep]
        out = model(input_ids=token[:, None], attention_mask=None if mask is None else mask[:, : width + t + 1],
                    position_ids=last_pos + (t + 1), past_key_values=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
        del out
    return tokens, logp


def _keep_rows(cache: Cache, keep: torch.Tensor) -> None:
    """Only the batch rows ``keep`` (ascending) stay in every layer of ``cache``, moved to its first rows in place."""
    for layer in cache.layers:
        layer.keep_rows(keep)
