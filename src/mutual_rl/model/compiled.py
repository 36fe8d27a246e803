"""``PolicySpec.compile``: the policy's training forwards through ``torch.compile``.

Every forward that computes log-probs of response tokens under the policy being trained (the update, recomputed
old log-probs, the regimes' forwards of peer responses) calls the model through :func:`training_model`. With
``compile: true`` that is ``torch.compile(model, dynamic=True)``: the same module and parameters, its forward and
backward traced once into fused kernels (on CPU, C++ code built by inductor), with symbolic batch and sequence
sizes, so the varying row counts and response widths of RL steps reuse the compiled code instead of recompiling.
Values and gradients are those of the eager model up to float rounding (tested).

What it costs and buys (docs/calibration.md): a one-off compile of about a minute on 2 CPU cores for the tiny
presets (more for larger models; a second graph for the shared-prompt forward, and one more for forwards without
gradient), then about 0.6x the eager update time on the 128-wide tiny GPT-2. Generation (``generate``), the KL
reference and evaluation stay eager.

Not with FSDP: FSDP's own hooks around each unit's forward do not trace, so ``MutualFSDPStrategy`` refuses a
policy with ``compile: true`` before it shards anything.
"""

from __future__ import annotations

import os
import shutil

from torch import nn


def check_compiler() -> None:
    """Raise ``ValueError`` when no C++ compiler is on PATH: inductor builds its CPU kernels with one."""
    names = [os.environ.get("CXX") or "", "g++", "c++", "clang++"]
    if not any(n and shutil.which(n) for n in names):
        raise ValueError("compile: true needs a C++ compiler for torch.compile's CPU kernels (g++ or clang++ on "
                         "PATH, or CXX set); install one (e.g. apt install g++) or set compile: false.")


def training_model(policy, model: nn.Module) -> nn.Module:
    """``model`` itself, or its compiled forward when ``policy.spec.compile`` and ``model`` is the policy's own
    trained model (the policy never passes its KL reference here). The compiled wrapper is built on first use and
    rebuilt if the policy's model object changes; it is kept outside the module tree, so it adds nothing to state
    dicts or ``parameters()``."""
    if not policy.spec.compile or model is not policy.model:
        return model
    cached = policy.__dict__.get("_compiled")
    if cached is not None and cached[0] is model:
        return cached[1]
    import torch

    compiled = torch.compile(model, dynamic=True)
    policy.__dict__["_compiled"] = (model, compiled)  # a plain attribute: not a submodule
    return compiled
