"""FSDP for N heterogeneous policies in one LightningModule: :class:`MutualFSDPStrategy`.

What it does on top of Lightning's ``FSDPStrategy``:

* **Auto-wrap**: one FSDP unit per decoder layer of *every* policy (the union of their decoder-layer classes,
  e.g. ``{"GPT2Block", "LlamaDecoderLayer"}``) and, with ``wrap_models`` (default), one unit per policy's whole
  causal-LM module (``*ForCausalLM`` / ``*LMHeadModel``), so each policy's embeddings and head live in that
  policy's own unit and the root (the LightningModule) owns no parameters. Class names are resolved lazily, at
  wrap time, from the modules of the loaded module (no transformers import here); ``decoder_layers=None``
  discovers them from each Hugging Face model's ``_no_split_modules``.
* ``use_orig_params=True`` (always): each policy has its own optimizer over its own parameters of one module.
* ``mixed_precision``: ``"bf16"`` | ``"fp16"`` | ``"fp32"`` (params, gradient reduction and buffers in that
  dtype) or ``None`` (Lightning's: follows ``trainer.precision``).
* ``activation_checkpointing``: checkpoint every decoder layer (same classes as the wrap).

Gradient clipping with manual optimization: ``torch.nn.utils.clip_grad_norm_`` over a policy's sharded
parameters computes a *per-rank* norm. :func:`clip_grad_norm_` here all-reduces the squared local shard norms
(every trainable parameter lives in exactly one sharded FSDP unit, which ``wrap_models`` guarantees) and falls
back to torch's function when nothing is sharded.

Multi-node: Lightning's standard launchers. On SLURM: ``#SBATCH --nodes=2 --ntasks-per-node=8 --gpus-per-node=8``
then ``srun mutual-rl fit --config configs/gpu/graft_qwen3_smollm3_full.yaml --trainer.num_nodes 2
--trainer.devices 8``. With torchrun on each node: ``torchrun --nnodes 2 --nproc-per-node 8 --node-rank $RANK
--master-addr $ADDR --master-port 29500 -m mutual_rl.cli fit --config ... --trainer.num_nodes 2
--trainer.devices 8``. Lightning detects the environment (SLURM / torchelastic) and sets ranks.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn

PRECISIONS = ("bf16", "fp16", "fp32")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def model_class_names(module: nn.Module) -> set[str]:
    """Names of the top-level causal-LM classes inside ``module`` (Hugging Face ``PreTrainedModel``\\ s that are
    not nested in another one)."""
    names, seen = set(), set()
    for _, m in module.named_modules():
        if id(m) in seen:
            continue
        if hasattr(m, "_no_split_modules") and hasattr(m, "config") and hasattr(m, "generate"):
            names.add(type(m).__name__)
            seen.update(id(x) for x in m.modules())
    return names


def decoder_layer_names(module: nn.Module) -> set[str]:
    """Union of the ``_no_split_modules`` class names of every Hugging Face model inside ``module``."""
    names: set[str] = set()
    for m in module.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    return names


def resolve_classes(module: nn.Module, names: set[str]) -> set[type[nn.Module]]:
    """The classes of ``module``'s submodules named in ``names``; a name matching no submodule is an error."""
    found = {type(m) for m in module.modules() if type(m).__name__ in names}
    missing = names - {c.__name__ for c in found}
    if missing:
        raise ValueError(f"FSDP: no module of class {sorted(missing)} in the model; its classes include "
                         f"{sorted({type(m).__name__ for m in module.modules()})[:20]}.")
    return found


class MutualFSDPStrategy(FSDPStrategy):
    """``FSDPStrategy`` for several heterogeneous policies (see the module docstring). YAML::

        trainer:
          strategy:
            class_path: mutual_rl.strategies.MutualFSDPStrategy
            init_args: {decoder_layers: [Qwen3DecoderLayer, SmolLM3DecoderLayer], mixed_precision: bf16,
                        activation_checkpointing: true}
    """

    def __init__(
        self,
        decoder_layers: list[str] | None = None,
        wrap_models: bool = True,
        mixed_precision: str | None = None,
        activation_checkpointing: bool = False,
        sharding_strategy: str = "FULL_SHARD",
        state_dict_type: str = "full",
        cpu_offload: bool = False,
        **kwargs,
    ):
        """
        Args:
            decoder_layers: class names of the policies' decoder blocks (default: each model's
                ``_no_split_modules``, found when the module is wrapped).
            wrap_models: also wrap each policy's whole causal-LM module in its own unit (needed by
                :func:`clip_grad_norm_` and per-policy weight gathering).
            mixed_precision: ``bf16`` | ``fp16`` | ``fp32`` or ``None`` (follow ``trainer.precision``).
            activation_checkpointing: recompute decoder-layer activations in backward.
            sharding_strategy: FSDP sharding (``FULL_SHARD``, ``SHARD_GRAD_OP``, ``HYBRID_SHARD``, ...).
            state_dict_type: checkpoint format, ``full`` or ``sharded``.
            cpu_offload: offload parameters to CPU.
        """
        if mixed_precision is not None and mixed_precision not in PRECISIONS:
            raise ValueError(f"MutualFSDPStrategy: mixed_precision={mixed_precision!r} is not one of: "
                             f"{', '.join(PRECISIONS)} (or null).")
        if kwargs.get("use_orig_params") is False:
            raise ValueError("MutualFSDPStrategy needs use_orig_params=True (one optimizer per policy).")
        kwargs["use_orig_params"] = True
        super().__init__(mixed_precision=_mixed_precision(mixed_precision), sharding_strategy=sharding_strategy,
                         state_dict_type=state_dict_type, cpu_offload=cpu_offload, **kwargs)
        self.decoder_layers = list(decoder_layers) if decoder_layers is not None else None
        self.wrap_models = wrap_models
        self.activation_checkpointing = activation_checkpointing

    def wrap_classes(self, module: nn.Module) -> tuple[set[type[nn.Module]], set[type[nn.Module]]]:
        """(classes to wrap, classes to checkpoint) for ``module``, resolved from its loaded submodules."""
        layers = set(self.decoder_layers) if self.decoder_layers is not None else decoder_layer_names(module)
        if not layers:
            raise ValueError("FSDP: no decoder-layer classes: set strategy.decoder_layers (e.g. [LlamaDecoderLayer]).")
        layer_classes = resolve_classes(module, layers)
        wrap = set(layer_classes)
        if self.wrap_models:
            wrap |= resolve_classes(module, model_class_names(module))
        return wrap, layer_classes

    def auto_wrap_policy(self, module: nn.Module):
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        return ModuleWrapPolicy(self.wrap_classes(module)[0])

    def _setup_model(self, model: nn.Module) -> nn.Module:
        wrap, layers = self.wrap_classes(model)
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        self.kwargs["auto_wrap_policy"] = ModuleWrapPolicy(wrap)
        if self.activation_checkpointing:
            self._activation_checkpointing_kwargs = {"auto_wrap_policy": ModuleWrapPolicy(layers)}
        return super()._setup_model(model)


def _mixed_precision(name: str | None):
    if name is None:
        return None
    from torch.distributed.fsdp import MixedPrecision

    dtype = _DTYPES[name]
    return MixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype)


def is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return any(isinstance(m, FullyShardedDataParallel) for m in module.modules())


@contextmanager
def full_params(module: nn.Module):
    """Context in which ``module``'s parameters are whole (gathered from their FSDP shards; a no-op without
    FSDP). Read-only: changes are not written back."""
    if not is_sharded(module):
        with nullcontext():
            yield module
        return
    from torch.distributed.fsdp import FullyShardedDataParallel

    with FullyShardedDataParallel.summon_full_params(module, writeback=False, recurse=True):
        yield module


@torch.no_grad()
def clip_grad_norm_(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Clip the global gradient norm of ``params`` (sharded under FSDP or not); returns the norm before clipping.

    Under FSDP with ``use_orig_params=True`` each rank's ``p.grad`` is its shard, so the norm is
    ``sqrt(all_reduce(sum ||g_shard||^2))``; this assumes every parameter is sharded in exactly one unit (true
    with ``MutualFSDPStrategy(wrap_models=True)``, FULL_SHARD or SHARD_GRAD_OP).
    """
    import torch.distributed as dist

    grads = [p.grad for p in params if p.grad is not None]
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    device = grads[0].device if grads else torch.device(torch.cuda.current_device())
    local = torch.zeros((), dtype=torch.float32, device=device)
    for g in grads:
        local += g.detach().float().pow(2).sum()
    dist.all_reduce(local)
    total = local.sqrt()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype))
    return total
