"""The memory plan of a fit, before step 0 (``MutualRLModule.on_fit_start`` calls :func:`plan_before_fit`).

On every device it records each policy's autocast dtype (``trainer.precision`` ``bf16-mixed`` -> bfloat16), which
the vLLM engine's ``dtype: auto`` follows. On CUDA it then plans the card (``memory/plan.py``) from the policies'
sizes (counted when each policy was built, before any sharding), the strategy, the precision, the engine and the
algorithm, against ``torch.cuda.mem_get_info`` and ``torch.cuda.get_device_properties(...).total_memory``; prints
the table on rank 0; sets every ``auto`` engine's ``gpu_memory_utilization`` (engines are built at their first
rollout, after this) and every policy's token budget (``policy.token_budget``) when
``algorithm.max_tokens_per_micro_batch`` is ``auto``; and refuses a run that cannot fit
(:class:`~mutual_rl.memory.plan.MemoryPlanError`, with the numbers and the knobs) before anything big is allocated.
Under several processes every rank plans its own card (the same numbers on identical cards).
"""

from __future__ import annotations

import torch

from mutual_rl.memory.footprint import PROMPT_ALLOWANCE, count_parameters, footprint
from mutual_rl.memory.plan import MemoryPlan, Settings, plan

_AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The dtype Lightning's ``trainer.precision`` autocasts to (``None``: no autocast)."""
    return _AUTOCAST.get(str(precision))


def settings_for(module) -> Settings:
    """The plan's settings from the live trainer, strategy, policies, engine and algorithm."""
    from mutual_rl.strategies import MutualFSDPStrategy

    trainer = module.trainer
    strategy = trainer.strategy
    fsdp = isinstance(strategy, MutualFSDPStrategy)
    policy = next(iter(module.policies.values()))
    master = (policy.param_counts or {}).get("dtype_bytes", 4)
    compute = master
    mixed = strategy.mixed_precision_config if fsdp else None
    if mixed is not None and mixed.param_dtype is not None:
        compute = min(master, torch.empty((), dtype=mixed.param_dtype).element_size())
    elif autocast_dtype(trainer.precision) is not None:
        compute = 2
    engine, utilization, engine_bytes = "hf", {}, compute
    if hasattr(module.engine, "resolved_args"):  # VLLMRolloutEngine
        engine = "vllm"
        for name, pol in module.policies.items():
            args = module.engine.resolved_args(pol)
            u = args["gpu_memory_utilization"]
            utilization[name] = None if u == "auto" else float(u)
            engine_bytes = torch.empty((), dtype=getattr(torch, args["dtype"])).element_size()
    budget = module.algorithm.max_tokens_per_micro_batch
    return Settings(world=trainer.world_size if fsdp else 1, fsdp=fsdp, master_bytes=master, compute_bytes=compute,
                    engine=engine, engine_bytes=engine_bytes, utilization=utilization,
                    token_budget=None if budget == "auto" else int(budget))


def footprints_for(module) -> list:
    """Each policy's :class:`~mutual_rl.memory.plan.Footprint` (sizes counted at build time, before sharding)."""
    from mutual_rl.model.lm_head import plain_head
    from mutual_rl.strategies import has_activation_checkpointing

    out = []
    for name, policy in module.policies.items():
        counts = {k: v for k, v in (policy.param_counts or count_parameters(policy.model)).items()
                  if k != "dtype_bytes"}
        args = module.engine.resolved_args(policy) if hasattr(module.engine, "resolved_args") else {}
        max_len = args.get("max_model_len") or (policy.spec.sampling.max_new_tokens
                                                + (policy.max_prompt_tokens or PROMPT_ALLOWANCE))
        out.append(footprint(
            name, policy.model, max_len=max_len, reference=policy._reference is not None,
            chunked_head=policy.chunked_head and plain_head(policy.model) is not None,
            checkpointing=policy.spec.gradient_checkpointing or has_activation_checkpointing(policy.model),
            counts=counts))
    return out


def card(device: torch.device) -> tuple[float, float, float]:
    """(free, total, held by this process's allocator) bytes of a CUDA ``device``."""
    free, _ = torch.cuda.mem_get_info(device)
    total = torch.cuda.get_device_properties(device).total_memory
    held = torch.cuda.memory_reserved(device) if torch.cuda.is_initialized() else 0
    return float(free), float(total), float(held)


def plan_before_fit(module, device: torch.device | None = None) -> MemoryPlan | None:
    """Record the autocast dtype on every policy; on CUDA plan the card, apply the plan and print it (module
    docstring). ``device``: the card (default: the module's)."""
    dtype = autocast_dtype(module.trainer.precision)
    for policy in module.policies.values():
        policy.autocast_dtype = dtype
    device = torch.device(device) if device is not None else module.device
    if device.type != "cuda":
        return None
    free, total, held = card(device)
    result = plan(footprints_for(module), settings_for(module), free=free, total=total, held=held)
    apply(module, result)
    if module.trainer.is_global_zero:
        print(result.table(), flush=True)
    return result


def apply(module, result: MemoryPlan) -> None:
    """Set the auto engines' ``gpu_memory_utilization`` and, when the algorithm's budget is auto, each policy's
    ``token_budget``."""
    for name, policy in module.policies.items():
        if module.algorithm.max_tokens_per_micro_batch == "auto":
            policy.token_budget = result.token_budget[name]
    if hasattr(module.engine, "set_planned_utilization"):
        module.engine.set_planned_utilization(result.utilization)
