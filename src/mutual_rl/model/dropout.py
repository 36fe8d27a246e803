"""Dropout off for RL forwards (``PolicySpec.disable_dropout``), and the checkpoint's own values for exports."""

from __future__ import annotations

import contextlib
import re

from torch import nn


def disable_dropout(model: nn.Module) -> list[tuple[object, str, float]]:
    """Dropout off in ``model``, in train mode too: every ``torch.nn.Dropout*`` module gets ``p = 0``, and every
    float attribute whose name contains ``dropout``, ``pdrop`` or ``layerdrop`` becomes 0.0, on each submodule
    (Llama's attention keeps ``attention_dropout`` as its own float) and on each model config and its sub-configs
    (some attention implementations read ``config.attention_dropout`` in their forward). Returns the config
    values it changed, ``(config, name, old value)``, so an export can write the checkpoint's own."""
    from transformers import PretrainedConfig

    changed: list[tuple[object, str, float]] = []

    def zero(obj) -> None:
        for key, value in list(vars(obj).items()):
            if isinstance(value, float) and _DROPOUT_NAME.search(key):
                if isinstance(obj, PretrainedConfig) and value != 0.0 and all(o is not obj or k != key
                                                                               for o, k, _ in changed):
                    changed.append((obj, key, value))
                setattr(obj, key, 0.0)
            elif isinstance(value, PretrainedConfig):
                zero(value)

    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
        zero(m)  # also its config (a plain attribute of Hugging Face modules)
    return changed


_DROPOUT_NAME = re.compile("dropout|pdrop|layerdrop")


@contextlib.contextmanager
def restored_dropout(values: list[tuple[object, str, float]]):
    """Inside, each ``(config, name, value)`` is set back to ``value``; on exit, to 0.0 again."""
    for obj, key, value in values:
        setattr(obj, key, value)
    try:
        yield
    finally:
        for obj, key, _ in values:
            setattr(obj, key, 0.0)
