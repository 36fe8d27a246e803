"""The sizes the memory plan needs (``memory/plan.py``), read from a loaded model, or from a Hugging Face config
through a model built on the ``meta`` device (no weights, nothing downloaded when the config is given), and the
plan's settings from a run's configuration (the YAML of ``mutual-rl fit``, as a dict).

Row length ``max_len`` (prompt + response tokens): the engine's ``max_model_len`` when set, else the policy's
``sampling.max_new_tokens`` plus :data:`PROMPT_ALLOWANCE` prompt tokens (the prompts are not read here).
"""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

from mutual_rl.memory.plan import Footprint, Settings

PROMPT_ALLOWANCE = 1024
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "bf16": 2, "fp16": 2, "fp32": 4}


def count_parameters(model: nn.Module) -> dict[str, int]:
    """``params`` (each tensor once: tied weights count once), ``trainable``, ``layers`` and ``layer_params`` (the
    largest decoder layer: a module whose class is in some ``_no_split_modules``) of an unsharded model."""
    seen: set[int] = set()
    params = trainable = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        params += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    sizes = [sum(p.numel() for p in m.parameters()) for m in layers]
    return {"params": params, "trainable": trainable, "layers": len(layers), "layer_params": max(sizes, default=0)}


def dimensions(config) -> dict[str, int]:
    """``hidden``, ``intermediate``, ``vocab`` and ``kv_width`` of a Hugging Face config (GPT-2 names too)."""
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    inter = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
    return {"hidden": hidden, "intermediate": int(inter), "vocab": int(config.vocab_size),
            "kv_width": kv_heads * head_dim}


def footprint(name: str, model: nn.Module, *, max_len: int, reference: bool, chunked_head: bool = True,
              checkpointing: bool = False, counts: dict[str, int] | None = None) -> Footprint:
    """A policy's :class:`Footprint` from its model (``counts``: :func:`count_parameters`, taken before sharding)."""
    from mutual_rl.model.lm_head import base_model, unwrap

    counts = counts or count_parameters(model)
    config = base_model(unwrap(model)).config
    return Footprint(name=name, **counts, **dimensions(config), max_len=int(max_len), reference=reference,
                     chunked_head=chunked_head, checkpointing=checkpointing)


def meta_model(config, lora: dict | None = None) -> nn.Module:
    """The causal LM of ``config`` on the meta device (no memory), with LoRA adapters when ``lora`` (``r``,
    ``alpha``, ``target_modules``) is given: what :func:`count_parameters` reads without the weights."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora.get("r", 8), lora_alpha=lora.get("alpha", 16),
                                                 target_modules=lora.get("target_modules", "all-linear"),
                                                 task_type="CAUSAL_LM"))
    return model


def settings_from_config(cfg: dict, *, world: int | None = None) -> Settings:
    """The plan's :class:`Settings` from a ``mutual-rl fit`` configuration (the YAML as a dict); ``world``
    overrides ``trainer.devices × trainer.num_nodes``."""
    trainer, model = cfg.get("trainer", {}), cfg.get("model", {})
    strategy = trainer.get("strategy") or {}
    fsdp = "MutualFSDPStrategy" in str(strategy.get("class_path", strategy) if isinstance(strategy, dict) else strategy)
    init = strategy.get("init_args", {}) if isinstance(strategy, dict) else {}
    devices = trainer.get("devices", 1)
    n = world if world is not None else (devices if isinstance(devices, int) else len(devices)) * trainer.get(
        "num_nodes", 1)
    master, compute = precision_bytes(str(trainer.get("precision", "32-true")), init.get("mixed_precision"))
    dtypes = {p.get("dtype", "float32") for p in model.get("policies", [])}
    if dtypes & {"bfloat16", "float16"}:
        master = compute = 2
    engine = model.get("rollout_engine", "auto")
    eng_args = engine.get("init_args", {}) if isinstance(engine, dict) else {}
    name = str(engine.get("class_path", "") if isinstance(engine, dict) else engine).lower()
    kind = "vllm" if "vllm" in name else "hf"
    if "auto" in name and importlib.util.find_spec("vllm") is not None:  # auto may choose vLLM: plan its engines
        kind, eng_args = "vllm", eng_args.get("vllm") or {}
    util = eng_args.get("gpu_memory_utilization", "auto")
    per = eng_args.get("per_policy", {}) or {}
    utilization = {}
    for p in model.get("policies", []):
        u = per.get(p["name"], {}).get("gpu_memory_utilization", util)
        utilization[p["name"]] = None if u in (None, "auto") else float(u)
    e_dtype = eng_args.get("dtype", "auto")
    engine_bytes = _BYTES.get(str(e_dtype), compute)
    budget = (model.get("algorithm") or {}).get("max_tokens_per_micro_batch", "auto")
    return Settings(world=int(n), fsdp=fsdp, master_bytes=master, compute_bytes=compute, engine=kind,
                    engine_bytes=engine_bytes, utilization=utilization,
                    token_budget=None if budget in (None, "auto") else int(budget))


def precision_bytes(precision: str, fsdp_mixed: str | None = None) -> tuple[int, int]:
    """(stored, compute) bytes per parameter for ``trainer.precision`` and the FSDP ``mixed_precision``."""
    p = precision.lower()
    if "true" in p and ("16" in p):
        master = compute = 2
    elif p in ("bf16", "16", "half"):
        master = compute = 2
    else:
        master, compute = 4, (2 if "mixed" in p else 4)
    if fsdp_mixed is not None:
        compute = min(master, _BYTES[fsdp_mixed])
    return master, compute


def max_len_of(policy_cfg: dict, engine_args: dict) -> int:
    """``max_len`` of the module docstring from a policy's configuration and the engine's arguments."""
    per = (engine_args.get("per_policy") or {}).get(policy_cfg["name"], {})
    mml = per.get("max_model_len", engine_args.get("max_model_len"))
    if mml:
        return int(mml)
    return int((policy_cfg.get("sampling") or {}).get("max_new_tokens", 32)) + PROMPT_ALLOWANCE
