"""Rewards that return numbers in other types than ``float`` (NumPy, torch, generators, sets), given to runs as
``tests.rewards.valued_rewards:<name>`` like a user's own reward. Imports torch and NumPy (a worker that imports
this module takes seconds to start)."""

from __future__ import annotations

import numpy as np
import torch

SCALARS = {
    "as_float": 0.25, "as_int": 3, "as_bool": True, "numpy_float32": np.float32(0.5), "numpy_0d": np.array(0.75),
    "tensor": torch.tensor(1.0), "tensor_float16": torch.tensor(0.125, dtype=torch.float16),
}


def _scalar(name):
    def fn(completion: str, answer: str):
        return SCALARS[name]
    fn.__name__ = fn.__qualname__ = name
    return fn


for _name in SCALARS:
    globals()[_name] = _scalar(_name)


def tensor_with_grad(completion: str, answer: str):
    """A reward computed with autograd on: ``requires_grad`` tensor (torch warns on ``float()`` of it)."""
    w = torch.tensor(2.0, requires_grad=True)
    return w * 0.25


def tensor_nan(completion: str, answer: str):
    return torch.tensor(float("nan"))


def tensor_pair(completion: str, answer: str):
    return torch.tensor([1.0, 2.0])


def trl_tensor(prompts, completions, **kw):
    return torch.tensor([float(len(c)) for c in completions], requires_grad=True) * 1.0


def trl_numpy(prompts, completions, **kw):
    return np.array([len(c) for c in completions], dtype=np.int64)


def trl_generator(prompts, completions, **kw):
    return (float(len(c)) for c in completions)


def trl_short_generator(prompts, completions, **kw):
    return (float(len(c)) for c in completions[1:])


def trl_endless_generator(prompts, completions, **kw):
    def endless():
        while True:
            yield 1.0
    return endless()


def trl_set(prompts, completions, **kw):
    return {float(len(c)) for c in completions}


def trl_frozenset(prompts, completions, **kw):
    return frozenset(float(len(c)) for c in completions)


def trl_dict(prompts, completions, **kw):
    return {c: float(len(c)) for c in completions}


def trl_dict_values(prompts, completions, **kw):
    return {c: float(len(c)) for c in completions}.values()


def trl_level(prompts, completions, level, **kw):
    return [float(len(c)) for c in completions]


class Poisoned:
    """A dataset value that pickles, but whose unpickling fails (``int('not a number')``): a hand-off fault."""

    def __reduce__(self):
        return (int, ("not a number",))
