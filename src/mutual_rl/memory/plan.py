"""The memory plan of one card: what each policy's trainer state, KL reference, rollout engine and activations take,
against what the card has, decided before step 0 (pure arithmetic; ``memory/fit.py`` runs it on CUDA).

Notation, per policy: ``P`` parameters (tied weights once), ``P_t`` trainable ones (``P`` for full fine-tuning, the
adapters under LoRA), ``L`` decoder layers of ``P_layer`` parameters each (the largest), ``P_root = P - L·P_layer``
(embeddings, final norm, head), ``h`` hidden size, ``i`` MLP width, ``V`` vocabulary, ``kv`` the key/value width
(key/value heads × head dim), ``W`` the FSDP world size (devices × nodes; 1 without ``MutualFSDPStrategy``),
``b_m`` bytes of the stored parameter dtype (4 for float32, 2 for ``PolicySpec.dtype`` bfloat16/float16), ``b_c``
bytes of the compute dtype (2 under bf16/fp16 mixed precision, else ``b_m``), ``b_e`` bytes of the engine dtype.
Every part of the table, in GB (10^9 bytes), per card:

* ``params``     ``b_m · P / W`` -- the stored weights (the float32 master under bf16-mixed), sharded by FSDP.
* ``compute``    the 16-bit working copy when ``b_c < b_m``: without FSDP ``b_c · P`` (autocast caches one cast of
  every weight per forward); under FSDP ``b_c · (P_root + 2 · P_layer)`` (the root unit stays gathered through
  forward and backward, plus the running and the prefetched decoder-layer unit). 0 otherwise.
* ``grads``      ``b_m · P_t / W`` (gradients in the parameter dtype, reduced to shards under FSDP).
* ``optimizer``  ``2 · b_m · P_t / W`` (AdamW's two moments, in the parameter dtype).
* ``reference``  the KL reference of a full-weight policy when ``kl_coef > 0``: ``b_c · P / W`` under FSDP
  (sharded in the compute dtype, ``strategies.shard_reference``), ``b_m · P`` otherwise (an unsharded copy); 0 under
  LoRA (the base model with adapters off) or without KL.
* ``engine``     a vLLM engine's reservation ``gpu_memory_utilization × total`` (one engine per policy, all of a
  card's engines side by side: sleep mode is refused with several). Its floor is ``b_e · P + kv_token · max_len +
  ENGINE_OVERHEAD`` with ``kv_token = 2 · L · kv · b_e`` (weights, the key/value cache of one whole sequence, the
  engine's own activations and CUDA graphs). 0 for the HF engine (it samples with the trainer's weights; its
  key/value cache is bounded by the activation budget's order, not planned separately -- a deviation).
* ``activations`` the token budget of a micro-batch times ``a_token``, per policy, where
  ``a_token = L · a_layer + head`` with ``a_layer = b_c · (8h + 4i) + 8h`` (per layer and token: attention inputs,
  projections and output ~8h, the MLP's gate, up, activation and product 4i, the two norms' float32 inputs 8h), or
  with activation checkpointing ``L · b_c · h + a_layer + head`` (each layer's input kept, one layer recomputed); ``head = 8h`` with the
  chunked output head (float32 hidden state and its gradient; plus one fixed chunk of ``HEAD_CHUNK_BYTES``), ``12V``
  with full logits (float32 logits, softmax and gradient). One policy's forward runs at a time, so the card needs
  the largest policy's activations, not their sum; the table shows each policy's.

The card: ``usable = free + held − margin`` with ``free`` from ``torch.cuda.mem_get_info``, ``held`` the bytes this
process's allocator already holds (counted in the parts above: the weights are on the card by then) and
``margin = 1 GB + 5 % of the card`` (CUDA context, allocator fragmentation, collectives' buffers). ``fixed = Σ
(params + compute + grads + optimizer + reference)`` over the policies.

``auto`` (the default of the engines' ``gpu_memory_utilization`` and of ``algorithm.max_tokens_per_micro_batch``):
what is left after ``fixed``, the explicit engines, every auto engine's floor and one whole row of activations (the
longest ``max_len`` of the largest ``a_token``) is split -- half to the activations, half shared equally by the auto
engines (all of it to whichever of the two is auto), an auto engine getting at most its floor plus the key/value
cache of ``ENGINE_MAX_SEQS`` = 256 more whole sequences (vLLM's default ``max_num_seqs``), the rest of its share
going to the activations; the token budget of each policy is then
``activation bytes / a_token`` of that policy. A plan that does not fit raises :class:`MemoryPlanError` with the
numbers and the knobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GB = 1e9
ENGINE_OVERHEAD = 1.0 * GB
ENGINE_MAX_SEQS = 256
HEAD_CHUNK_BYTES = 3 * 4 * (1 << 24)  # logits, softmax and gradient of one chunk (algorithms/token_logp.py)
PARTS = ("params", "compute", "grads", "optimizer", "reference", "engine", "activations")


class MemoryPlanError(ValueError):
    """The policies, engines and activations do not fit the card."""


@dataclass(frozen=True)
class Footprint:
    """One policy's sizes (``memory/footprint.py`` reads them from a model or a config)."""

    name: str
    params: int
    trainable: int
    layers: int
    layer_params: int
    hidden: int
    intermediate: int
    vocab: int
    kv_width: int
    max_len: int  # longest prompt + response of a row, tokens
    reference: bool = False  # a KL reference copy exists (kl_coef > 0, no LoRA)
    chunked_head: bool = True
    checkpointing: bool = False  # activation / gradient checkpointing


@dataclass(frozen=True)
class Settings:
    """How the run holds and computes its weights, and what the user fixed (``None``: auto)."""

    world: int = 1
    fsdp: bool = False
    master_bytes: int = 4
    compute_bytes: int = 4
    engine: str = "hf"  # "vllm" | "hf"
    engine_bytes: int = 2
    utilization: dict[str, float | None] = field(default_factory=dict)  # per policy; None or missing: auto
    token_budget: int | None = None


@dataclass
class MemoryPlan:
    """Per policy, bytes per part; the engines' utilisations and the token budgets the plan chose."""

    total: float
    usable: float
    rows: dict[str, dict[str, float]]
    utilization: dict[str, float]
    token_budget: dict[str, int]
    per_token: dict[str, float]

    def need(self) -> float:
        """Bytes the plan uses: every part of every policy, the activations of the largest policy only."""
        fixed = sum(v for r in self.rows.values() for k, v in r.items() if k != "activations")
        return fixed + max((r["activations"] for r in self.rows.values()), default=0.0)

    def table(self) -> str:
        """One line per policy: GB for each part; then the card."""
        head = f"{'policy':<12}" + "".join(f"{p:>12}" for p in PARTS) + f"{'tokens/mb':>11}"
        lines = ["memory plan (GB per card)", head]
        for name, row in self.rows.items():
            lines.append(f"{name:<12}" + "".join(f"{row[p] / GB:>12.2f}" for p in PARTS)
                         + f"{self.token_budget.get(name, 0):>11d}")
        lines.append(f"need {self.need() / GB:.2f} of usable {self.usable / GB:.2f} (card {self.total / GB:.2f}); "
                     + ", ".join(f"{n}: gpu_memory_utilization {u:.3f}" for n, u in self.utilization.items()))
        return "\n".join(lines)


def trainer_parts(f: Footprint, s: Settings) -> dict[str, float]:
    """``params``, ``compute``, ``grads``, ``optimizer`` and ``reference`` bytes of one policy (module docstring)."""
    w = s.world if s.fsdp else 1
    compute = 0.0
    if s.compute_bytes < s.master_bytes:
        gathered = (f.params - f.layers * f.layer_params + 2 * f.layer_params) if s.fsdp else f.params
        compute = s.compute_bytes * gathered
    reference = 0.0
    if f.reference:
        reference = s.compute_bytes * f.params / w if s.fsdp else s.master_bytes * f.params
    return {"params": s.master_bytes * f.params / w, "compute": compute, "grads": s.master_bytes * f.trainable / w,
            "optimizer": 2 * s.master_bytes * f.trainable / w, "reference": reference}


def activation_bytes_per_token(f: Footprint, s: Settings) -> float:
    """``a_token`` of the module docstring."""
    b = s.compute_bytes
    layer = b * (8 * f.hidden + 4 * f.intermediate) + 8 * f.hidden
    body = f.layers * b * f.hidden + layer if f.checkpointing else f.layers * layer
    return body + (8 * f.hidden if f.chunked_head else 12 * f.vocab)


def engine_floor(f: Footprint, s: Settings) -> float:
    """The least a vLLM engine for ``f`` needs: its weights, one whole sequence's key/value cache, its overhead."""
    if s.engine != "vllm":
        return 0.0
    kv_token = 2 * f.layers * f.kv_width * s.engine_bytes
    return s.engine_bytes * f.params + kv_token * f.max_len + ENGINE_OVERHEAD


def engine_cap(f: Footprint, s: Settings) -> float:
    """The most an ``auto`` engine is given: its floor plus the key/value cache of ``ENGINE_MAX_SEQS`` more whole
    sequences (vLLM's default ``max_num_seqs``: it never runs more at once)."""
    return engine_floor(f, s) + 2 * f.layers * f.kv_width * s.engine_bytes * f.max_len * ENGINE_MAX_SEQS


def margin(total: float) -> float:
    return 1.0 * GB + 0.05 * total


def plan(footprints: list[Footprint], s: Settings, *, free: float, total: float, held: float = 0.0) -> MemoryPlan:
    """The plan of one card with ``free`` bytes free and ``held`` bytes already held by this process (see the
    module docstring); raises :class:`MemoryPlanError` when it cannot fit."""
    usable = free + held - margin(total)
    rows = {f.name: {**trainer_parts(f, s), "engine": 0.0, "activations": 0.0} for f in footprints}
    per_token = {f.name: activation_bytes_per_token(f, s) for f in footprints}
    fixed = sum(sum(r.values()) for r in rows.values())
    floors = {f.name: engine_floor(f, s) for f in footprints}
    auto_engines = [f.name for f in footprints if s.engine == "vllm" and s.utilization.get(f.name) is None]
    for f in footprints:
        if s.engine == "vllm" and f.name not in auto_engines:
            rows[f.name]["engine"] = s.utilization[f.name] * total
    row_tokens = max(f.max_len for f in footprints)
    act_floor = max(per_token.values()) * row_tokens + _chunk(footprints)
    engines = sum(rows[n]["engine"] for n in rows) + sum(floors[n] for n in auto_engines)
    act_need = act_floor if s.token_budget is None else max(per_token.values()) * s.token_budget + _chunk(footprints)
    rest = usable - fixed - engines - act_need
    low = [n for n in rows if s.engine == "vllm" and n not in auto_engines and rows[n]["engine"] < floors[n]]
    if rest < 0 or low:
        raise MemoryPlanError(_refusal(footprints, s, rows, floors, auto_engines, act_need, usable, total, low))
    share_act = rest / 2 if (s.token_budget is None and auto_engines) else (rest if s.token_budget is None else 0.0)
    each = (rest - share_act) / max(len(auto_engines), 1)
    for f in footprints:
        if f.name in auto_engines:
            extra = min(each, engine_cap(f, s) - floors[f.name])
            rows[f.name]["engine"] = floors[f.name] + extra
            share_act += (each - extra) if s.token_budget is None else 0.0
    act_bytes = act_need + share_act - _chunk(footprints)
    budgets = {}
    for f in footprints:
        budgets[f.name] = s.token_budget if s.token_budget is not None else int(act_bytes // per_token[f.name])
        rows[f.name]["activations"] = budgets[f.name] * per_token[f.name] + _chunk([f])
    utilization = {n: rows[n]["engine"] / total for n in rows} if s.engine == "vllm" else {}
    return MemoryPlan(total=total, usable=usable, rows=rows, utilization=utilization, token_budget=budgets,
                      per_token=per_token)


def _chunk(footprints: list[Footprint]) -> float:
    return HEAD_CHUNK_BYTES if any(f.chunked_head for f in footprints) else 0.0


def _refusal(footprints, s, rows, floors, auto_engines, act_need, usable, total, low) -> str:
    """The error: what the policies need, per part, what the card has, and the knobs that lower the need."""
    fixed = {n: sum(r.values()) for n, r in rows.items()}
    engines = {n: (floors[n] if n in auto_engines else rows[n]["engine"]) for n in rows}
    need = sum(fixed.values()) + sum(engines.values()) + act_need
    parts = "; ".join(
        f"{n}: " + ", ".join(f"{k} {v / GB:.1f}" for k, v in rows[n].items() if k not in ("engine", "activations")
                             and v) + (f", engine {engines[n] / GB:.1f}" if engines[n] else "") for n in rows)
    msg = (f"memory plan: the policies need {need / GB:.1f} GB per card ({parts}; activations of one micro-batch "
           f"{act_need / GB:.1f}), the card has {usable / GB:.1f} GB usable of {total / GB:.1f} (after a "
           f"{margin(total) / GB:.1f} GB margin). ")
    if low:
        msg += ("gpu_memory_utilization of " + ", ".join(f"{n} ({rows[n]['engine'] / total:.3f})" for n in low)
                + " is below the engine's floor (" + ", ".join(f"{floors[n] / total:.3f}" for n in low)
                + " of the card: its weights, one max_model_len sequence's key/value cache and 1 GB): raise it or "
                "set it to auto. ")
    knobs = []
    if any(f.trainable == f.params for f in footprints):
        knobs.append("train LoRA adapters (policies[].lora: {r: 16}): no full gradients or AdamW state")
    knobs.append("shard over more GPUs (trainer.devices / trainer.num_nodes with MutualFSDPStrategy)"
                 if s.fsdp else "shard with trainer.strategy MutualFSDPStrategy over several GPUs")
    if s.engine == "vllm" and len(auto_engines) < len(rows):
        knobs.append("lower the engines' gpu_memory_utilization (or set auto)")
    if s.engine == "vllm":
        knobs.append("lower the engines' max_model_len (an engine holds one whole sequence's key/value cache)")
    if s.token_budget is not None:
        knobs.append("lower algorithm.max_tokens_per_micro_batch (or set auto)")
    if not all(f.checkpointing for f in footprints):
        knobs.append("turn on activation_checkpointing (strategy) or gradient_checkpointing (policy)")
    if any(f.reference for f in footprints):
        knobs.append("set algorithm.kl_coef: 0 (no reference copy)")
    return msg + "To fit: " + "; or ".join(knobs) + "."
