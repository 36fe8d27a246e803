"""The model's forward up to its last hidden states, with the output embedding applied outside, in chunks
(``mutual_rl.algorithms.token_logp``): the trainer's log-probs without full-vocabulary logits.

How: for the duration of one forward, the model's output embedding (``get_output_embeddings()``) is replaced by
``nn.Identity``, so the model returns its final hidden states where it would return logits (the same slicing by
``logits_to_keep``, the same key/value caches); the real head is then applied per chunk of tokens. Tied embeddings
stay tied (the same module is put back).

Only where that is exactly the model's computation: architectures whose causal-LM forward is ``lm_head(hidden)``
with nothing after it (:data:`PLAIN_HEAD_MODEL_TYPES`; Gemma 2/3's soft-capping or Cohere's and Granite's logit
scales are not in it), a plain ``nn.Linear`` head (not a LoRA-wrapped one), and a model not sharded by FSDP (there
the head's weight lives in the root unit's gathered parameters only during the root's forward). Everywhere else
:func:`plain_head` returns ``None`` and the policy builds full logits, as before.
"""

from __future__ import annotations

import contextlib

from torch import nn

from mutual_rl.distributed import is_sharded

PLAIN_HEAD_MODEL_TYPES = frozenset({
    "gpt2", "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "smollm3", "phi3", "olmo2",
})


def base_model(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside a peft wrapper, or ``model`` itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def plain_head(model: nn.Module) -> nn.Linear | None:
    """The output embedding of ``model`` (a Hugging Face causal LM or its peft wrapper) when the chunked path
    computes exactly the model's logits; else ``None``."""
    base = base_model(model)
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_MODEL_TYPES or is_sharded(model):
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
