"""Weight sync into an in-process vLLM engine, and the differential probe that verifies it (no vllm import here).

**What is pushed** (:func:`hf_weights`): the policy's parameters under a plain Hugging Face model's names, as a
stream. LoRA (peft): each adapted layer's base weight plus its delta ``get_delta_weight`` (``scale * B @ A``,
transposed for ``fan_in_fan_out`` layers), adapter tensors dropped, ``base_layer.`` removed; the training weights
are not modified. Without FSDP the stream yields the live parameters (vLLM copies them into its own storage);
under FSDP it gathers **one FSDP unit at a time** (``summon_full_params(unit, recurse=False)``: the root's own
parameters, then each decoder-layer unit) and yields copies of that unit's full weights before the next unit is
gathered, so a rank never holds a second copy of the whole model (every rank must consume the stream: each unit's
gather is a collective).

**How it is loaded** (:func:`push_weights`): vLLM's in-place reload (``collective_rpc("reload_weights",
weights_iterator=..., is_checkpoint_format=True)``), which re-runs each layer's weight processing (on vLLM's CPU
backend linear weights are repacked for oneDNN and the original parameter emptied, so a plain
``model.load_weights`` fails with ``'Parameter' object has no attribute 'weight_loader'``). Then every module whose
weight is *tied* to another module's (a tied LM head) has its processing re-run: the reload never loads a tied head
by name, and vLLM's CPU backend keeps a packed copy of it that would otherwise stay stale (*ours*: found with the
real engine, where the probe after a sync on both tiny presets differed by 0.29 / 0.26 nats until re-packed). Last,
the prefix cache is reset (cached key/values of the old weights would be reused otherwise). vLLM without
``reload_weights`` (older releases) gets ``model.load_weights`` through ``apply_model``.

**The differential probe** (*ours*). vLLM and the trainer never agree exactly: their kernels differ, and in bf16 the
gap on real models reaches tenths of a nat per token (vllm#18352). So the probe records the engine-vs-trainer gap
on fixed probe texts when the engine is built from the trainer's own weights (:class:`ProbeBaseline`: the mean and
the max of ``|Δ logp|`` over the probe tokens), and after each sync requires ``mean ≤ baseline mean + margin`` and
``max ≤ baseline max + 4 * margin``, with a dtype-aware ``margin`` (:func:`default_margin`). A stale engine shows
the gap the trainer's updates opened since the engine last held its weights: the probe also reports
``probe_moved_mean``, how far the trainer's own probe log-probs have moved since the engine was built, which is
what a stale engine's gap would be. While that is below the margin the probe cannot tell stale from synced weights;
the baseline is never re-recorded, so a sync that silently stops working is caught once the weights have moved
past the margin.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

#: (prompt text, response text) pairs of the weight-sync probe: short fixed text, no task's format or content (the
#: prompt goes through the policy's ``encode_prompt``, so its chat template and BOS apply)
PROBE_TEXTS = (
    ("The quick brown fox", " jumps over the lazy dog."),
    ("Hello, world", "! How are you today?"),
    ("Name three colours:", " red, green and blue."),
    ("Count to five:", " 1, 2, 3, 4, 5."),
)


class WeightSyncError(RuntimeError):
    """vLLM's log-probs after a weight sync differ from the trainer's beyond the probe's baseline and margin."""


# ------------------------------------------------------------------------------------------------ weights
def _lora_deltas(modules: Sequence[tuple[str, nn.Module]]) -> dict[str, torch.Tensor]:
    """``{module name: sum of its active adapters' delta weights}`` for the peft LoRA layers among ``modules``."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # pragma: no cover - peft is a dependency
        return {}
    deltas = {}
    for name, mod in modules:
        if isinstance(mod, LoraLayer):
            active = [a for a in mod.active_adapters if a in mod.lora_A]
            if active and not getattr(mod, "merged", False):
                deltas[name] = sum(mod.get_delta_weight(a) for a in active)
    return deltas


def _walk(module: nn.Module, prefix: str, stop: set[int]):
    """``(name, module)`` of ``module`` and its descendants, not entering modules whose id is in ``stop``."""
    yield prefix.rstrip("."), module
    for child_name, child in module.named_children():
        if id(child) not in stop:
            yield from _walk(child, f"{prefix}{child_name}.", stop)


def _named_weights(modules: Sequence[tuple[str, nn.Module]], clone: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """The parameters directly owned by ``modules`` as plain Hugging Face ``(name, tensor)``, LoRA merged."""
    from mutual_rl.strategies import clean_name

    cleaned = [(clean_name(n), m) for n, m in modules]
    deltas = _lora_deltas(cleaned)
    seen: set[int] = set()
    for owner, mod in cleaned:
        for pname, value in mod.named_parameters(recurse=False):
            if id(value) in seen:
                continue
            seen.add(id(value))
            name = f"{owner}.{pname}" if owner else pname
            if "lora_" in name:
                continue
            name = name.replace(".base_layer.", ".")
            out = value.detach()
            lora_owner = name.rsplit(".", 1)[0]
            if name.endswith(".weight") and lora_owner in deltas:
                out = out + deltas[lora_owner].to(out.dtype)
            elif clone:
                out = out.clone()
            yield name, out


def plain_model(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside a policy's model (under an FSDP root and a peft wrapper, if any)."""
    from mutual_rl.policies.lm_head import base_model
    from mutual_rl.strategies import unwrap

    return base_model(unwrap(model))


@torch.no_grad()
def hf_weights(policy) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's parameters as a plain Hugging Face model's ``(name, tensor)`` stream (module docstring): tied
    parameters once (vLLM ties them itself), wrapper components removed from names. Under FSDP one unit is gathered
    at a time; every rank must consume the whole stream."""
    from mutual_rl.distributed import is_sharded

    model = policy.model
    base = plain_model(model)
    if not is_sharded(model):
        yield from _named_weights(list(_walk(base, "", set())), clone=False)
        return
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    units = [(n, m) for n, m in base.named_modules() if isinstance(m, FSDP)]
    stop = {id(m) for _, m in units}
    with FSDP.summon_full_params(model, writeback=False, recurse=False):  # the root unit: embeddings, norm, head
        yield from _named_weights(list(_walk(base, "", stop)), clone=True)
    for name, unit in units:
        with FSDP.summon_full_params(unit, writeback=False, recurse=False):
            inner_stop = stop - {id(unit)}
            yield from _named_weights(list(_walk(unit, f"{name}.", inner_stop)), clone=True)


def push_weights(llm, weights: Iterator[tuple[str, torch.Tensor]]) -> list[str]:
    """Load ``weights`` into the in-process vLLM engine ``llm`` (module docstring); returns the names of the tied
    modules whose weight processing was re-run."""
    reload = True
    try:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
    except AttributeError as err:  # vLLM before in-place reloads
        if "reload_weights" not in str(err):
            raise
        reload = False
    if not reload:
        llm.apply_model(lambda model: model.load_weights(weights))
    retied = llm.apply_model(reprocess_tied_modules)
    llm.reset_prefix_cache()
    return sorted({n for names in retied for n in names})


@torch.no_grad()
def reprocess_tied_modules(model: nn.Module) -> list[str]:
    """Re-run the weight processing (``quant_method.process_weights_after_loading``) of every module whose
    ``weight`` parameter is another module's too (a tied LM head), after the owner's weight was reloaded."""
    owners: dict[int, list[tuple[str, nn.Module]]] = {}
    for name, mod in model.named_modules():
        w = mod.__dict__.get("_parameters", {}).get("weight")
        if isinstance(w, nn.Parameter):
            owners.setdefault(id(w), []).append((name, mod))
    done = []
    for mods in owners.values():
        for name, mod in mods[1:]:
            method = getattr(mod, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(mod)
                done.append(name)
    return done


# -------------------------------------------------------------------------------------------------- probe
def probe_pairs(policy) -> list[tuple[list[int], list[int]]]:
    """Fixed (prompt ids, response ids) pairs of :data:`PROBE_TEXTS`, independent of the task: the prompt text is
    encoded as a prompt of the policy (``encode_prompt``: chat template, BOS), the response without special
    tokens."""
    pairs = []
    for prompt_text, response in PROBE_TEXTS:
        prompt = policy.encode_prompt(prompt_text)
        resp = policy.tokenizer(response, add_special_tokens=False)["input_ids"]
        pairs.append((list(prompt), list(resp)))
    return pairs


@torch.no_grad()
def trainer_probe_logp(policy, pairs) -> list[torch.Tensor]:
    """The trainer's log-probs (temperature 1, no dropout) of each pair's response tokens, on the CPU."""
    out, was_training = [], policy.model.training
    policy.model.eval()
    try:
        for prompt, resp in pairs:
            ids = torch.tensor([prompt + resp], device=policy.device)
            logp, _ = policy.response_logp(ids, torch.ones_like(ids), len(resp), 1.0)
            out.append(logp[0].float().cpu())
    finally:
        policy.model.train(was_training)
    return out


def default_margin(dtype: str | torch.dtype) -> float:
    """The probe's allowed growth of the mean gap over its baseline: 1e-4 nats for float32 engines (measured gaps
    on the tiny presets: ~1e-6), 2e-2 for bfloat16/float16 (*ours*: bf16 rounding moves with the weights)."""
    return 1e-4 if "32" in str(dtype) else 2e-2


def _gaps(trainer: Sequence[torch.Tensor], engine: Sequence[torch.Tensor]) -> torch.Tensor:
    if len(trainer) != len(engine) or not trainer:
        raise ValueError("probe: need the same, non-zero number of trainer and engine rows.")
    diffs = []
    for a, b in zip(trainer, engine):
        if a.shape != b.shape:
            raise ValueError(f"probe: shapes differ ({tuple(a.shape)} vs {tuple(b.shape)}).")
        diffs.append((a.float().cpu() - b.float().cpu()).abs())
    return torch.cat(diffs)


@dataclass(frozen=True)
class ProbeBaseline:
    """The engine-vs-trainer gap on the probe tokens when the engine was built from the trainer's own weights."""

    mean: float
    max: float
    trainer_logp: tuple[torch.Tensor, ...]  # the trainer's probe log-probs then (what a stale engine still shows)

    @classmethod
    def record(cls, trainer: Sequence[torch.Tensor], engine: Sequence[torch.Tensor], *, policy: str = "?",
               limit: float = 5.0) -> ProbeBaseline:
        """The baseline of a fresh engine; a gap above ``limit`` nats (or NaN) means it did not load the trainer's
        weights at all (wrong names, dtype or architecture): :class:`WeightSyncError`."""
        d = _gaps(trainer, engine)
        mean, top = float(d.mean()), float(d.max())
        if not mean <= limit:
            raise WeightSyncError(
                f"policy {policy!r}: the new vLLM engine's log-probs differ from the trainer's by mean {mean:.3g} "
                f"nats per token (max {top:.3g}) on the probe texts: it did not load the trainer's weights (check the "
                "architecture is supported by vLLM, the dtype and the tokenizer).")
        return cls(mean, top, tuple(t.detach().float().cpu() for t in trainer))

    def check(self, trainer: Sequence[torch.Tensor], engine: Sequence[torch.Tensor], margin: float, *,
              policy: str = "?") -> dict[str, float]:
        """Probe metrics after a sync; :class:`WeightSyncError` when the gap grew past the margin (NaN fails)."""
        d = _gaps(trainer, engine)
        moved = _gaps(list(self.trainer_logp), trainer)
        out = {"probe_gap_mean": float(d.mean()), "probe_gap_max": float(d.max()),
               "probe_baseline_mean": self.mean, "probe_moved_mean": float(moved.mean())}
        ok_mean = out["probe_gap_mean"] <= self.mean + margin
        ok_max = out["probe_gap_max"] <= self.max + 4 * margin
        if not (ok_mean and ok_max):
            raise WeightSyncError(
                f"policy {policy!r}: after the weight sync vLLM's log-probs differ from the trainer's by mean "
                f"{out['probe_gap_mean']:.3g} (max {out['probe_gap_max']:.3g}) nats per probe token, against "
                f"{self.mean:.3g} ({self.max:.3g}) when the engine was built, beyond the margin {margin:g}: the "
                f"engine is not sampling from the trained weights (the trainer's probe log-probs have moved "
                f"{out['probe_moved_mean']:.3g} since then; TRL #5312 and verl #7495 are this bug class). Check the "
                "weight names, the LoRA merge and the dtype, or raise model.rollout_engine.init_args.probe_margin "
                "if the growth is numeric noise.")
        return out
