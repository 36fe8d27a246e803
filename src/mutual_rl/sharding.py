"""FSDP units of one policy (:func:`shard_model`), its frozen KL reference (:func:`shard_reference`) and the
mixed-precision settings they are built with: parameters gathered in the compute dtype, gradients reduced and
buffers held in float32 (see ``mutual_rl.strategies``, whose ``MutualFSDPStrategy`` uses them)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

PRECISIONS = ("bf16", "fp16", "fp32")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def shard_model(model: nn.Module, layer_classes: set[type[nn.Module]], device: torch.device, **kwargs) -> nn.Module:
    """``model`` as its own FSDP root with one nested unit per ``layer_classes`` module (``use_orig_params``).

    ``device``: this rank's device; on CPU it is passed to FSDP explicitly (torch's FSDP needs that to run on
    CPU with gloo)."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    device_id = torch.device("cpu") if device.type == "cpu" else device.index
    return FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy(layer_classes), device_id=device_id,
                                    use_orig_params=True, **kwargs)


def shard_reference(model: nn.Module, layer_classes: set[type[nn.Module]], device: torch.device,
                    mixed_precision=None, **kwargs) -> nn.Module:
    """A frozen KL reference as its own FSDP root (:func:`shard_model`), its floating parameters first cast to the
    compute dtype of ``mixed_precision`` (buffers untouched: float32 rotary frequencies stay float32). The cast
    rounds as FSDP's own cast of the policy's float32 shards does, so at step 0 the reference computes exactly what
    the policy computes."""
    dtype = getattr(mixed_precision, "param_dtype", None)
    if dtype is not None:
        for p in model.parameters():
            if p.is_floating_point():
                p.data = p.data.to(dtype)
    return shard_model(model.requires_grad_(False), layer_classes, device, mixed_precision=mixed_precision, **kwargs)


def _mixed_precision(name: str | None):
    """FSDP's ``MixedPrecision`` for ``name``: parameters gathered in that dtype, float32 gradient reduction and
    buffers (``None``: none set here)."""
    if name is None:
        return None
    from torch.distributed.fsdp import MixedPrecision

    return MixedPrecision(param_dtype=_DTYPES[name], reduce_dtype=torch.float32, buffer_dtype=torch.float32)


def float32_reduction_and_buffers(config):
    """``config`` (an FSDP ``MixedPrecision`` or ``None``) with float32 gradient reduction and buffers, the parameter
    dtype kept."""
    if config is None:
        return None
    return dataclasses.replace(config, reduce_dtype=torch.float32, buffer_dtype=torch.float32)
