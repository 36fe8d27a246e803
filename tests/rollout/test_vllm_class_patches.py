"""``shield_trainer_models``: a trainer model whose class vLLM's Transformers backend re-decorated in-process (its
``__call__`` replaced by one that reads ``self.do_not_compile``, set only by the decorated ``__init__``) runs its
plain forward again; one with forward hooks is refused, naming the class. The decoration is reproduced here as
vLLM 0.32 applies it (``vllm/compilation/decorators.py``: ``cls.__call__`` reads ``self.do_not_compile``), so this
runs without vLLM; the real case (SmolLM3 through vLLM on the CPU) is ``tests/gpu/test_real_arch.py[vllm]``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mutual_rl.rollout.vllm_process import shield_trainer_models


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        return self.lin(x) * 2


def _decorated_call(self, *args, **kwargs):  # what vLLM's support_torch_compile installs on the class
    if self.do_not_compile:
        return self.forward(*args, **kwargs)
    raise AssertionError("the compiled path")


_decorated_call.__module__ = "vllm.compilation.decorators"


def test_a_redecorated_class_runs_its_forward_again(monkeypatch):
    outer = nn.Sequential(Inner(), nn.ReLU())
    x = torch.randn(4, 3)
    want = outer(x)
    monkeypatch.setattr(Inner, "__call__", _decorated_call, raising=False)  # the engine build, in-process
    with pytest.raises(AttributeError, match="do_not_compile"):
        outer(x)
    assert shield_trainer_models([outer]) == 1
    torch.testing.assert_close(outer(x), want, rtol=0, atol=0)
    assert shield_trainer_models([outer]) == 0  # marked once


def test_a_module_with_hooks_is_refused(monkeypatch):
    inner = Inner()
    inner.register_forward_hook(lambda m, i, o: o + 1)
    monkeypatch.setattr(Inner, "__call__", _decorated_call, raising=False)
    with pytest.raises(RuntimeError, match="Inner.*forward hooks"):
        shield_trainer_models([inner])
