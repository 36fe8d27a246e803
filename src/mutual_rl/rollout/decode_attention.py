"""Attention for one-token queries on the CPU, used while ``generate`` decodes *(ours)*.

Each decoding step of ``generate`` attends one new query token per row to the whole key/value cache, and the
step's cost grows with the cache (128 rows of the tiny GPT-2: ~8 ms at 6 cached positions, ~25 ms at 134). On the
CPU, PyTorch's ``scaled_dot_product_attention`` kernel handles that shape poorly: for 128 rows x 4 heads at 70
cached positions it takes 0.67 ms where two batched matrix products over the same cache take 0.36 ms, and 1.35 ms
when the cache is a slice of a longer buffer (docs/calibration.md). Inside :func:`decode_attention`, transformers'
attention function registered as ``"sdpa"`` is :func:`one_query_attention`, which runs a one-token query as

    ``softmax(q @ k^T * scale + mask) @ v``

with two ``torch.bmm`` calls over the cache as it is (no copy of the keys and values, grouped-query heads without
repeating them) -- the formula ``sdpa`` computes, a fully masked row giving zeros as ``sdpa``'s CPU kernel does --
and hands everything else to transformers' own ``sdpa`` function unchanged: prompts (several query tokens),
training forwards (anything that needs a gradient), dropout, position biases, paged caches, accelerators, and dtypes
other than float32 (where ``sdpa`` accumulates in a wider type than its inputs). The model's configuration is not
touched, so its attention implementation still reads ``"sdpa"`` (modeling code that branches on that name, mask
creation and sub-models on other implementations behave as outside), and models that call
``scaled_dot_product_attention`` themselves are unaffected. The same tokens are sampled with the same log-probs as
with ``sdpa`` up to float rounding (tested).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from mutual_rl.model.lm_head import base_model

# what every case but the fast one goes to: the function registered as "sdpa" when the context was entered
_delegate = [sdpa_attention_forward]


def one_query_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                        **kwargs):
    """transformers' attention-function signature; ``query`` ``[B, H, q, D]``, ``key``/``value`` ``[B, Hkv, L, D]``.

    Returns ``([B, q, H, Dv], None)`` like ``sdpa_attention_forward``, to which (or to whatever was registered as
    ``"sdpa"`` before) every case but a float32 CPU one-token query without gradient, dropout, position bias or
    paged cache is handed.
    """
    if not _applies(query, key, value, attention_mask, dropout, kwargs):
        return _delegate[-1](module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                             is_causal=is_causal, **kwargs)
    b, h, _, d = query.shape
    hkv, length, dv = key.shape[1], key.shape[2], value.shape[-1]
    g = h // hkv  # query heads per key/value head: head i reads key/value head i // g (as repeat_kv lays them out)
    # [B, Hkv, L, D] -> [B*Hkv, L, D] is a view also for a cache that is a slice of a longer buffer
    scores = torch.bmm(query.reshape(b * hkv, g, d), key.reshape(b * hkv, length, d).transpose(1, 2))
    scores.mul_(d ** -0.5 if scaling is None else scaling)
    if attention_mask is not None:
        scores4 = scores.view(b, hkv, g, length)
        if attention_mask.dtype == torch.bool:  # [B or 1, 1, 1, L]
            scores4.masked_fill_(~attention_mask, float("-inf"))
        else:
            scores4.add_(attention_mask)
    probs = torch.softmax(scores, dim=-1)
    if attention_mask is not None:
        probs.nan_to_num_(0.0)  # a fully masked row: zeros, as sdpa gives
    out = torch.bmm(probs, value.reshape(b * hkv, length, dv))  # [B*Hkv, G, Dv]
    return out.view(b, 1, h, dv), None


def _applies(query, key, value, attention_mask, dropout, kwargs) -> bool:
    if query.shape[2] != 1 or query.device.type != "cpu" or query.dtype != torch.float32:
        return False
    if dropout or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None:
        return False
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
        return False
    if key.dtype != query.dtype or value.dtype != query.dtype or key.shape[-1] != query.shape[-1]:
        return False
    if query.shape[1] % key.shape[1] or key.shape[0] != query.shape[0]:
        return False
    if attention_mask is not None:
        m = attention_mask
        if m.dim() != 4 or m.shape[1] != 1 or m.shape[2] != 1 or m.shape[0] not in (1, query.shape[0]) \
                or m.shape[3] != key.shape[2] or (m.dtype != torch.bool and m.dtype != query.dtype):
            return False
    return True


@contextmanager
def decode_attention(model, enabled: bool = True):
    """Inside, transformers' ``"sdpa"`` attention function is :func:`one_query_attention` if ``model`` (a Hugging
    Face model or a peft / FSDP wrapper of one) attends with ``"sdpa"`` and lives on the CPU; otherwise, or with
    ``enabled=False``, nothing changes. The registered function is restored on exit (also after an error); nested
    uses restore in order."""
    target = base_model(model)
    config = getattr(target, "config", None)
    device = getattr(target, "device", None)
    if not enabled or config is None or getattr(config, "_attn_implementation", None) != "sdpa" \
            or device is None or torch.device(device).type != "cpu":
        yield
        return
    own = ALL_ATTENTION_FUNCTIONS["sdpa"]
    if own is one_query_attention:  # already inside
        yield
        return
    _delegate.append(own)
    AttentionInterface.register("sdpa", one_query_attention)
    try:
        yield
    finally:
        AttentionInterface.register("sdpa", own)
        _delegate.pop()
