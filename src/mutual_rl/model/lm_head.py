"""The model's forward up to its last hidden states, with the output embedding applied outside, in chunks
(``mutual_rl.algorithms.token_logp``): the trainer's log-probs without full-vocabulary logits.

How: for the duration of one forward, the model's output embedding (``get_output_embeddings()``) is replaced by
``nn.Identity``, so the model returns its final hidden states where it would return logits (the same slicing by
``logits_to_keep``, the same key/value caches); the real head is then applied per chunk of tokens. Tied embeddings
stay tied (the same module is put back).

Only where that is exactly the model's computation: architectures whose causal-LM forward is ``lm_head(hidden)``
with nothing after it (:data:`PLAIN_HEAD_MODEL_TYPES`; Gemma 2/3's soft-capping or Cohere's and Granite's logit
scales are not in it) and a plain ``nn.Linear`` head (not a LoRA-wrapped one). Everywhere else :func:`plain_head`
returns ``None`` and the policy builds full logits.

Under FSDP the head's weight is a view into the root unit's gathered parameters only *during the root's forward*
(outside it, it is this rank's shard). So the whole computation -- the model's forward(s) up to the hidden states
and the chunked head -- runs inside one forward of the root unit (:func:`in_root_forward`): the root gathers its
parameters (embeddings, final norm, head) once, every decoder-layer unit gathers its own as in any forward, and
the head's gradient flows into the root's flat parameter, reduced like any other (tested on two ranks,
``tests/distributed/test_fsdp_precision.py``).
"""

from __future__ import annotations

import contextlib

from torch import nn

PLAIN_HEAD_MODEL_TYPES = frozenset({
    "gpt2", "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "smollm3", "phi3", "olmo2",
})


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside an FSDP unit, or ``model`` itself."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return model.module if isinstance(model, FullyShardedDataParallel) else model


def base_model(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside a peft wrapper, or ``model`` itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def plain_head(model: nn.Module) -> nn.Linear | None:
    """The output embedding of ``model`` (a Hugging Face causal LM or its peft wrapper) when the chunked path
    computes exactly the model's logits; else ``None``."""
    base = base_model(unwrap(model))
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_MODEL_TYPES:
        return None
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    return head if type(head) is nn.Linear else None


@contextlib.contextmanager
def hidden_states_out(model: nn.Module, head: nn.Linear):
    """Inside, ``model(...).logits`` are the final hidden states ``[..., H]`` (``head`` is put back on exit)."""
    base = base_model(model)
    base.set_output_embeddings(nn.Identity())
    try:
        yield
    finally:
        base.set_output_embeddings(head)


def in_root_forward(model: nn.Module, fn):
    """``fn(inner)`` computed inside one forward of ``model``'s FSDP root unit, where the root's gathered parameters
    (the head's weight among them) are valid; ``fn(model)`` when ``model`` is not an FSDP unit.

    How: for the duration of the call the wrapped module's ``forward`` is replaced so that the root's call runs
    ``fn``; calls of the wrapped module made by ``fn`` itself reach its real ``forward``. Autograd sees ``fn``'s
    outputs as the root forward's outputs (FSDP's pre-backward hooks are registered on them)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    if not isinstance(model, FullyShardedDataParallel):
        return fn(model)
    inner = model.module
    own = inner.__dict__.get("forward")  # an instance-level forward set by someone else: put it back
    original = inner.forward
    depth = [0]

    def routed(*args, **kwargs):
        if depth[0]:  # fn calling the model: its real forward
            return original(*args, **kwargs)
        depth[0] += 1
        try:
            return fn(inner)
        finally:
            depth[0] -= 1

    inner.forward = routed
    try:
        return model()
    finally:
        if own is None:
            del inner.forward
        else:
            inner.forward = own
