"""FSDP for N heterogeneous policies in one LightningModule: :class:`MutualFSDPStrategy`.

What it does on top of Lightning's ``FSDPStrategy``:

* **One FSDP root per policy**: each policy's model (``policy.model``: the Hugging Face model, or its peft
  wrapper under LoRA) becomes its own FSDP root, with one nested unit per decoder layer (the union of the
  policies' decoder-layer classes, e.g. ``{"GPT2Block", "LlamaDecoderLayer"}``). The LightningModule itself is
  *not* wrapped. Why: with manual optimization every backward is a policy's own; FSDP finalises gradients
  (reduce-scatter waits, sharded-gradient views for the optimizer, resharding) in a callback that only a *root*
  queues, and it forbids gathering full parameters (weight export, vLLM weight sync) inside a root's forward --
  which is where Lightning runs ``training_step`` when the LightningModule is the root. Each policy owns its
  embeddings and head in its root unit, so every parameter lives in exactly one sharded unit. Class names are
  resolved lazily, at wrap time, from the loaded modules (no transformers import here); ``decoder_layers=None``
  discovers them from each Hugging Face model's ``_no_split_modules``.
* **CPU**: torch's FSDP runs on CPU (gloo) when told the device, which Lightning does not do; this strategy
  does, so the multi-rank logic is tested on a laptop (``tests/distributed``).
* ``use_orig_params=True`` (always): each policy has its own optimizer over its own parameters of one module.
* ``mixed_precision``: ``"bf16"`` | ``"fp16"`` | ``"fp32"``: the dtype the gathered parameters compute in;
  gradients are reduced (reduce-scatter) in float32 and buffers stay float32 in every case. ``None`` follows
  ``trainer.precision`` as Lightning maps it (``bf16-mixed`` -> bf16 parameters), with the same two corrections:
  Lightning's own mapping casts buffers and the reduction to the half dtype too, and a bf16 rotary ``inv_freq``
  (base 1e6, head dim 128) rotates position 3,000 by an angle 3.5 rad off -- the trainer would score long
  completions with a position encoding the engine does not share (test: tests/distributed/test_fsdp_precision.py).
* The **output head in chunks under FSDP** (``model/lm_head.py``): the policy's log-probs are computed inside its
  root unit's forward, where the head's gathered weight is valid, so no ``[B, T, V]`` logits exist under FSDP
  either.
* The **KL reference** of a full-weight policy is sharded like the policy (its own FSDP root, frozen, no optimizer)
  and held in the compute dtype (the parameters' bf16 rounding, exactly what the policy computes with at step 0;
  buffers float32): ``2 * P / world`` bytes per rank under bf16, where it was an unsharded float32 copy
  (``4 * P``) on every rank. Under LoRA the reference is the base model with the adapters off (nothing extra).
* ``activation_checkpointing``: checkpoint every decoder layer (same classes as the wrap).

Gradient clipping with manual optimization: ``torch.nn.utils.clip_grad_norm_`` over a policy's sharded
parameters computes a *per-rank* norm. :func:`clip_grad_norm_` here all-reduces the squared local shard norms
(every trainable parameter lives in exactly one sharded FSDP unit) and falls back to torch's function when nothing
is sharded.

Several processes train on different prompts (``PromptDataModule``); see ``mutual_rl.distributed`` for how the
ranks stay in lockstep and how loss normalisers become global.

Multi-node: Lightning's standard launchers. On SLURM: ``#SBATCH --nodes=2 --ntasks-per-node=8 --gpus-per-node=8``
then ``srun mutual-rl fit --config configs/gpu/graft_qwen3_smollm3_full.yaml --trainer.num_nodes 2
--trainer.devices 8``. With torchrun on each node: ``torchrun --nnodes 2 --nproc-per-node 8 --node-rank $RANK
--master-addr $ADDR --master-port 29500 -m mutual_rl.cli fit --config ... --trainer.num_nodes 2
--trainer.devices 8``. Lightning detects the environment (SLURM / torchelastic) and sets ranks.
"""

from __future__ import annotations

import atexit
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn

from mutual_rl.distributed import collective_device, destroy_process_group, is_sharded  # noqa: F401 (re-exported)
from mutual_rl.sharding import (  # noqa: F401 (re-exported)
    PRECISIONS,
    _mixed_precision,
    float32_reduction_and_buffers,
    shard_model,
    shard_reference,
)

SHARDINGS = ("FULL_SHARD", "SHARD_GRAD_OP")


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
            mixed_precision: ``bf16`` | ``fp16`` | ``fp32`` or ``None`` (follow ``trainer.precision``).
            activation_checkpointing: recompute decoder-layer activations in backward.
            sharding_strategy: FSDP sharding, ``FULL_SHARD`` or ``SHARD_GRAD_OP``.
            state_dict_type: checkpoint format, ``full`` or ``sharded``.
            cpu_offload: offload parameters to CPU.
        """
        if mixed_precision is not None and mixed_precision not in PRECISIONS:
            raise ValueError(f"MutualFSDPStrategy: mixed_precision={mixed_precision!r} is not one of: "
                             f"{', '.join(PRECISIONS)} (or null).")
        if str(sharding_strategy).upper().split(".")[-1] not in SHARDINGS:
            raise ValueError(f"MutualFSDPStrategy: sharding_strategy={sharding_strategy!r} is not one of: "
                             f"{', '.join(SHARDINGS)} (gradient clipping sums each parameter's shards once over "
                             "all ranks, which replicated strategies would count several times).")
        if kwargs.get("use_orig_params") is False:
            raise ValueError("MutualFSDPStrategy needs use_orig_params=True (one optimizer per policy).")
        kwargs["use_orig_params"] = True
        super().__init__(mixed_precision=_mixed_precision(mixed_precision), sharding_strategy=sharding_strategy,
                         state_dict_type=state_dict_type, cpu_offload=cpu_offload, **kwargs)
        self.decoder_layers = list(decoder_layers) if decoder_layers is not None else None
        self.state_dict_type = state_dict_type
        self.activation_checkpointing = activation_checkpointing

    @property
    def mixed_precision_config(self):
        """The FSDP mixed precision (explicit, or Lightning's from ``trainer.precision``) with float32 gradient
        reduction and buffers (module docstring)."""
        return float32_reduction_and_buffers(super().mixed_precision_config)

    def setup_environment(self) -> None:
        """Lightning's set-up (the process group), plus its destruction at exit: see ``destroy_process_group``."""
        super().setup_environment()
        atexit.unregister(destroy_process_group)  # once, however many fits this process runs
        atexit.register(destroy_process_group)

    # Full state dicts, through torch's public FSDP API. Lightning's full-state paths always ask FSDP to "offload
    # to CPU", which for parameters that already live on the CPU leaves views into freed gather buffers (a segfault
    # when cloned); here offloading is on exactly when the parameters live on an accelerator. Sharded checkpoints
    # are Lightning's, unchanged.
    def _full_state(self, rank0_only: bool = True):
        from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        offload = self.root_device.type != "cpu"
        return FSDP.state_dict_type(
            self.model, StateDictType.FULL_STATE_DICT,
            state_dict_config=FullStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only),
            optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only),
        )

    def lightning_module_state_dict(self):
        """The LightningModule's state dict; ``full``: every policy's whole parameters, on rank 0."""
        if self.state_dict_type != "full":
            return super().lightning_module_state_dict()
        with self._full_state():
            return self.model.state_dict()

    def optimizer_state(self, optimizer):
        """One policy optimizer's state; ``full``: whole (rank 0), keyed by parameter id as a plain optimizer's."""
        if self.state_dict_type != "full":
            return super().optimizer_state(optimizer)
        from lightning.pytorch.core.optimizer import LightningOptimizer
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import OptimStateKeyType

        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer.optimizer
        with self._full_state():
            state = FSDP.optim_state_dict(self.model, optimizer)
            if self.global_rank == 0:
                state = FSDP.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_ID, self.model)
        return state

    def load_checkpoint(self, checkpoint_path, weights_only=None):
        """Load a checkpoint on every rank; a full one (a file) here, a sharded one (a folder) as Lightning does.

        A full checkpoint's parameters go into the shards of every rank, and when fitting each policy's optimizer
        state is re-sharded for this rank (``FSDP.optim_state_dict_to_load``). The file is read whole on every rank
        through the strategy's ``checkpoint_io`` (``weights_only`` as for a single-process resume), where
        Lightning's own FSDP path maps it lazily: a node holds one copy per rank while loading."""
        path = Path(self.broadcast(checkpoint_path))
        if not path.is_file():
            return super().load_checkpoint(path, weights_only=weights_only)
        from lightning.pytorch.trainer.states import TrainerFn
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import OptimStateKeyType

        checkpoint = self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)
        module = self.lightning_module
        with self._full_state(rank0_only=False):
            self.model.load_state_dict(checkpoint.pop("state_dict"), strict=module.strict_loading)
        states = checkpoint.get("optimizer_states")
        if states is None or module.trainer.state.fn != TrainerFn.FITTING:
            return checkpoint
        if len(states) != len(self.optimizers):
            raise RuntimeError(f"The checkpoint {path} holds {len(states)} optimizer states and this run has "
                               f"{len(self.optimizers)} policies' optimizers: resume with the same policies.")
        with self._full_state(rank0_only=False):
            for optimizer, state in zip(self.optimizers, states):
                groups = state.get("param_groups") or [{}]
                if groups[0].get("params") and isinstance(groups[0]["params"][0], int):  # by id: by name for FSDP
                    state = FSDP.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_NAME, self.model)
                optimizer.load_state_dict(FSDP.optim_state_dict_to_load(self.model, optimizer, state))
        return checkpoint

    def layer_classes(self, module: nn.Module) -> set[type[nn.Module]]:
        """The decoder-layer classes to wrap (and to checkpoint) in ``module``, resolved from its submodules."""
        layers = set(self.decoder_layers) if self.decoder_layers is not None else decoder_layer_names(module)
        if not layers:
            raise ValueError("FSDP: no decoder-layer classes: set strategy.decoder_layers (e.g. [LlamaDecoderLayer]).")
        return resolve_classes(module, layers)

    def auto_wrap_policy(self, module: nn.Module):
        """The nested-unit policy inside each policy's root: one unit per decoder layer."""
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        return ModuleWrapPolicy(self.layer_classes(module))

    def _setup_model(self, model: nn.Module) -> nn.Module:
        from lightning.pytorch.strategies.fsdp import _setup_activation_checkpointing
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        policies = getattr(model, "policies", None)
        if not policies:
            raise ValueError("MutualFSDPStrategy shards the policies of a MutualRLModule (its `policies`); for "
                             "another LightningModule use Lightning's FSDPStrategy.")
        layers = self.layer_classes(model)
        kwargs = {k: v for k, v in self.kwargs.items() if k not in ("auto_wrap_policy", "use_orig_params")}
        for policy in policies.values():
            if isinstance(policy.model, FullyShardedDataParallel):
                continue
            if policy.spec.compile:
                raise ValueError(f"policy {policy.name!r}: compile: true is not supported under MutualFSDPStrategy; "
                                 "set compile: false for sharded policies.")
            policy.model = shard_model(policy.model, layers, self.root_device, cpu_offload=self.cpu_offload,
                                       mixed_precision=self.mixed_precision_config,
                                       sharding_strategy=self.sharding_strategy, **kwargs)
            reference = getattr(policy, "_reference", None)
            if reference and not isinstance(reference[0], FullyShardedDataParallel):
                reference[0] = shard_reference(reference[0], layers, self.root_device, cpu_offload=self.cpu_offload,
                                               mixed_precision=self.mixed_precision_config,
                                               sharding_strategy=self.sharding_strategy, **kwargs)
        if self.activation_checkpointing:
            _setup_activation_checkpointing(model, {"auto_wrap_policy": ModuleWrapPolicy(layers)})
        return model


_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def clean_name(name: str) -> str:
    """A parameter name without FSDP / activation-checkpointing / compile wrapper components."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def unwrap(module: nn.Module) -> nn.Module:
    """The model inside an FSDP root (``module`` itself when it is not one)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return module.module if isinstance(module, FullyShardedDataParallel) else module


@torch.no_grad()
def plain_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """``module``'s parameters and persistent buffers under the names of the plain (unwrapped) model, copied.

    Under FSDP call it inside :func:`full_params` (every rank); ``state_dict()`` of a module with nested FSDP units
    would go through FSDP's own state-dict hooks instead (and under LoRA lose the adapters)."""
    model = unwrap(module)
    out = {clean_name(k): v.detach().clone() for k, v in model.named_parameters()}
    for prefix, m in model.named_modules():
        for name, buf in m._buffers.items():
            if buf is not None and name not in m._non_persistent_buffers_set:
                out.setdefault(clean_name(f"{prefix}.{name}" if prefix else name), buf.detach().clone())
    return out


def has_activation_checkpointing(module: nn.Module) -> bool:
    """Some submodule of ``module`` is wrapped for activation checkpointing (recomputed in backward)."""
    return any(type(m).__name__ == "CheckpointWrapper" for m in module.modules())


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


@contextmanager
def generation_params(module: nn.Module):
    """Yields the model to call ``.generate(...)`` on; ``module`` may be an FSDP unit (a no-op without FSDP).

    ``generate`` is a method of the wrapped Hugging Face model and calls the *inner* model, which would skip the
    unit's parameter gathering (and ``summon_full_params`` is not allowed inside the training step, which runs in
    the root unit's forward). So, inside this context, the Hugging Face model's ``forward`` (under LoRA: the
    peft model's base model) is routed through the FSDP unit: every decoding step gathers the unit's parameters
    exactly as a training forward does (the peft forward then applies the adapters), and the nested decoder-layer
    units gather their own.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    if not isinstance(module, FullyShardedDataParallel):
        with nullcontext():
            yield module
        return
    inner = module.module
    # the model whose forward ``generate`` ends up calling: the Hugging Face model, also under a peft wrapper
    target = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    original = target.forward
    own = target.__dict__.get("forward")  # an instance-level forward set by someone else (hooks): put it back
    depth = [0]

    def routed(*args, **kwargs):
        if depth[0]:  # called back by the FSDP unit: the real forward
            return original(*args, **kwargs)
        depth[0] += 1
        try:
            return module(*args, **kwargs)
        finally:
            depth[0] -= 1

    target.forward = routed
    try:
        yield inner
    finally:
        if own is None:
            del target.forward
        else:
            target.forward = own


@torch.no_grad()
def clip_grad_norm_(params: list[torch.Tensor], max_norm: float, sharded: bool = False) -> torch.Tensor:
    """Clip the global gradient norm of ``params``; returns the norm before clipping.

    ``sharded=False``: torch's ``clip_grad_norm_`` (the gradients are whole on this rank -- also in a
    multi-process run when the model is not sharded). ``sharded=True`` (FSDP with ``use_orig_params=True``): each
    rank's ``p.grad`` is its shard, so the norm is ``sqrt(all_reduce(sum ||g_shard||^2))``; this assumes every
    parameter is sharded in exactly one unit (true with ``MutualFSDPStrategy``, FULL_SHARD or SHARD_GRAD_OP).
    """
    import torch.distributed as dist

    grads = [p.grad for p in params if p.grad is not None]
    if not (sharded and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    local = torch.zeros((), dtype=torch.float32, device=collective_device())  # grads may be offloaded to CPU
    for g in grads:
        local += g.detach().float().pow(2).sum().to(local.device)
    dist.all_reduce(local)
    total = local.sqrt()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.to(device=g.device, dtype=g.dtype))
    return total
