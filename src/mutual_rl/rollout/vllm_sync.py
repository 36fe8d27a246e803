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
the prefix cache is reset (cached key/values of the old weights would be reused otherwise). A vLLM without
``reload_weights`` (before 0.32) is refused.

**The differential probe** (*ours*). vLLM and the trainer never agree exactly: their kernels differ, and in half
precision the gap on real models reaches tenths of a nat per token (vllm#18352; SmolLM2-135M in bf16 on vLLM's
CPU backend: mean 0.043, max 0.26). So the probe scores fixed probe texts with both when the engine is built from
the trainer's own weights (:class:`ProbeBaseline`: the mean and the max of ``|Δ logp|`` over the probe tokens),
and after each sync requires

* ``mean ≤ baseline mean + margin`` and ``max ≤ 2 * baseline max + 4 * margin`` (:func:`default_margin`: 1e-4
  nats when engine and trainer compute in float32, ``max(2e-2, baseline mean)`` when either computes in bf16/fp16;
  the trainer's probe forward runs outside autocast, so under ``bf16-mixed`` its side is float32 -- only the
  engine's dtype, bf16 with ``dtype: auto``, makes it half), and
* that the engine *followed* the updates: with ``Δt`` the change of the trainer's probe log-probs since the last
  checked sync and ``Δe`` the engine's, ``followed = rms(Δe) / rms(Δt)`` is about 1 for an engine that loaded them
  (rounding noise moves both sides alike) and 0 for a stale one (its outputs do not move), and ``aligned``, the
  cosine of ``Δe`` and ``Δt``, is near 1 (a wrong-signed or unrelated change is not); both must be at least 0.5
  once ``rms(Δt)`` is at least twice ``σ``, the per-token spread (root mean square) of the engine-vs-trainer
  difference at creation. Smaller changes cannot be told from rounding noise: they are reported
  (``probe_followed`` NaN, ``probe_change_rms``) and add up, since the reference moves only when the check ran.
  The gap check against the baseline, which is never re-recorded, also catches a sync that stopped working once the
  weights have moved past the margin (``probe_moved_mean``: how far the trainer's probe log-probs are from those at
  creation). A projection of ``Δe`` on ``Δt`` alone would not do in half precision: rounding noise in ``Δt`` biases
  it towards 0 (measured 0.5-0.8 for synced bf16 engines).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from mutual_rl.stats import ProbeStats

#: (prompt text, response text) pairs of the weight-sync probe: short fixed text, no task's format or content (the
#: prompt goes through the policy's ``encode_prompt``, so its chat template and BOS apply)
PROBE_TEXTS = (
    ("The quick brown fox", " jumps over the lazy dog, then runs back into the woods before the sun goes down."),
    ("Hello, world", "! How are you today? I hope the weather is fine where you are, and the trains run on time."),
    ("Name three colours:", " red, green and blue; and if you want more, yellow, purple and a shade of grey."),
    ("Count to ten:", " 1, 2, 3, 4, 5, 6, 7, 8, 9, 10. Then back down again: 9, 8, 7, 6, 5, 4, 3, 2, 1."),
    ("Spell the word garden:", " g, a, r, d, e, n. It has six letters, and two of them are the same: no, none are."),
    ("Write a short list of fruits:", " apples, pears, plums, cherries, oranges, lemons and a bunch of grapes."),
    ("Describe the sea in one sentence.", " The sea is wide and grey, and its waves break white on the rocks."),
    ("Finish the sentence: Every morning I", " drink a cup of tea, read the news and walk to work along the river."),
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
        if isinstance(mod, LoraLayer):  # linear / Conv1D layers keep adapters in lora_A, embeddings in lora_embedding_A
            have = set(mod.lora_A) | set(getattr(mod, "lora_embedding_A", {}))
            active = [a for a in mod.active_adapters if a in have]
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
    from mutual_rl.model.lm_head import base_model
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
    try:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
    except AttributeError as err:
        if "reload_weights" not in str(err):
            raise
        raise RuntimeError("this vLLM has no in-place weight reload (reload_weights); mutual-rl's vLLM engine needs "
                           "vLLM >= 0.32.") from err
    retied = llm.apply_model(reprocess_tied_modules)
    llm.reset_prefix_cache()
    return sorted({n for names in retied for n in names})


@torch.no_grad()
def reprocess_tied_modules(model: nn.Module) -> list[str]:
    """Re-run the weight processing (``quant_method.process_weights_after_loading``) of every module whose
    ``weight`` parameter another module shares (a tied LM head and its embedding), after the reload. Processing a
    module again from its current weight is idempotent, so the owner is re-processed too."""
    owners: dict[int, list[tuple[str, nn.Module]]] = {}
    for name, mod in model.named_modules():
        w = mod.__dict__.get("_parameters", {}).get("weight")
        if isinstance(w, nn.Parameter):
            owners.setdefault(id(w), []).append((name, mod))
    done = []
    for mods in owners.values():
        if len(mods) < 2:
            continue
        for name, mod in mods:
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


@contextlib.contextmanager
def outside_autocast():
    """No autocast (CPU, and CUDA where present) inside: under ``bf16-mixed`` a rollout and a sync run inside the
    training step's bf16 autocast, which would otherwise reach the LoRA merge (its ``B @ A`` rounded to bf16: probe
    gaps of 6e-4 on a float32 engine) and vLLM's own forward. vLLM computes in the engine's dtype."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autocast(device_type="cpu", enabled=False))
        if torch.cuda.is_available():
            stack.enter_context(torch.autocast(device_type="cuda", enabled=False))
        yield


@torch.no_grad()
def trainer_probe_logp(policy, pairs) -> list[torch.Tensor]:
    """The trainer's log-probs (temperature 1, no dropout, outside any autocast: a sync runs inside the training
    step, under ``bf16-mixed`` in bf16 autocast) of each pair's response tokens, on the CPU."""
    out, was_training = [], policy.model.training
    policy.model.eval()
    try:
        with torch.autocast(device_type=policy.device.type, enabled=False):
            for prompt, resp in pairs:
                ids = torch.tensor([prompt + resp], device=policy.device)
                logp, _ = policy.response_logp(ids, torch.ones_like(ids), len(resp), 1.0)
                out.append(logp[0].float().cpu())
    finally:
        policy.model.train(was_training)
    return out


def trainer_probe_dtype(policy) -> torch.dtype:
    """The dtype the trainer's side of the probe computes in (:func:`trainer_probe_logp` runs outside autocast):
    FSDP's ``mixed_precision.param_dtype`` when set, else the parameters' dtype."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    root = next((m for m in policy.model.modules() if isinstance(m, FSDP)), None)
    mixed = getattr(root, "mixed_precision", None) if root is not None else None
    if mixed is not None and getattr(mixed, "param_dtype", None) is not None:
        return mixed.param_dtype
    return next(policy.model.parameters()).dtype


def trainer_compute_dtype(policy) -> torch.dtype:
    """The dtype the trainer's forwards compute in (an engine's ``dtype: auto``): FSDP's
    ``mixed_precision.param_dtype`` when set, else the autocast dtype of the run's precision
    (``policy.autocast_dtype``, set when a fit starts: bfloat16 under ``bf16-mixed``), else the parameters' dtype.
    The probe's trainer side computes without the autocast (:func:`trainer_probe_dtype`)."""
    dtype = trainer_probe_dtype(policy)
    autocast = getattr(policy, "autocast_dtype", None)
    return autocast if autocast is not None and dtype == torch.float32 else dtype


def is_half(*dtypes) -> bool:
    """Whether any of ``dtypes`` (torch dtypes or names, vLLM's ``half`` included) is a 16-bit float."""
    return any("16" in str(d) or str(d) == "half" for d in dtypes)


def default_margin(half: bool, baseline_mean: float = 0.0) -> float:
    """The probe's allowed growth of the mean gap over its baseline (*ours*, measured on vLLM's CPU backend):
    1e-4 nats when engine and trainer compute in float32 (gaps on the tiny presets and SmolLM2-135M: 1e-6 to 5e-5);
    ``max(2e-2, baseline mean)`` when either computes in bfloat16/float16 (``half``), since half-precision rounding
    is drawn anew with every weight change (SmolLM2-135M in bf16: baseline mean 0.047, after each of 8 syncs
    0.035-0.045)."""
    return max(2e-2, baseline_mean) if half else 1e-4


def baseline_limit(half: bool) -> float:
    """The largest mean gap a freshly built engine may have (*ours*): 1e-2 nats in float32, 0.5 in half
    precision; more means the engine did not load the trainer's weights."""
    return 0.5 if half else 1e-2


#: the probe's "followed" check runs when the trainer's probe log-probs changed by at least this many times the
#: engine-vs-trainer spread per token since the last checked sync (smaller changes cannot be told from rounding)
FOLLOW_SNR = 2.0
#: ... and requires the engine's change to be at least this fraction as large as the trainer's, and at least this
#: aligned with it (cosine)
FOLLOW_MIN = 0.5


def _flat(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([r.detach().float().cpu().reshape(-1) for r in rows])


def _gaps(trainer: Sequence[torch.Tensor], engine: Sequence[torch.Tensor]) -> torch.Tensor:
    if len(trainer) != len(engine) or not trainer:
        raise ValueError("probe: need the same, non-zero number of trainer and engine rows.")
    for a, b in zip(trainer, engine):
        if a.shape != b.shape:
            raise ValueError(f"probe: shapes differ ({tuple(a.shape)} vs {tuple(b.shape)}).")
    return (_flat(trainer) - _flat(engine)).abs()


@dataclass
class ProbeBaseline:
    """The engine-vs-trainer gap on the probe tokens when the engine was built from the trainer's own weights, and
    the probe log-probs of both at the last verified sync (for the *followed* check, module docstring)."""

    mean: float
    max: float
    sigma: float  # per-token spread (root mean square) of the engine-vs-trainer difference at creation, >= 1e-6
    trainer_logp: torch.Tensor  # [tokens] the trainer's probe log-probs at creation (what a stale engine shows)
    last_trainer: torch.Tensor  # [tokens] the trainer's, at the last verified sync
    last_engine: torch.Tensor  # [tokens] the engine's, at the last verified sync

    @classmethod
    def record(cls, trainer: Sequence[torch.Tensor], engine: Sequence[torch.Tensor], *, policy: str = "?",
               limit: float = 1e-2) -> ProbeBaseline:
        """The baseline of a fresh engine; a mean gap above ``limit`` nats (:func:`baseline_limit`; or NaN) means it
        did not load the trainer's weights (wrong names, dtype or architecture): :class:`WeightSyncError`."""
        d = _gaps(trainer, engine)
        mean, top = float(d.mean()), float(d.max())
        if not mean <= limit:
            raise WeightSyncError(
                f"policy {policy!r}: the new vLLM engine's log-probs differ from the trainer's by mean {mean:.3g} "
                f"nats per token (max {top:.3g}) on the probe texts, above {limit:g}: it did not load the trainer's "
                "weights (check the architecture is supported by vLLM, the dtype and the tokenizer).")
        t, e = _flat(trainer), _flat(engine)
        sigma = max(float((e - t).pow(2).mean().sqrt()), 1e-6)
        return cls(mean, top, sigma, t, t, e)

    def check(self, trainer: Sequence[torch.Tensor], engine: Sequence[torch.Tensor], margin: float, *,
              policy: str = "?") -> ProbeStats:
        """Probe statistics after a sync; :class:`WeightSyncError` when the gap grew past the margin (NaN fails) or the
        engine did not follow the trainer's change since the last sync. Remembers this sync when it passes."""
        d = _gaps(trainer, engine)
        t, e = _flat(trainer), _flat(engine)
        dt, de = t - self.last_trainer, e - self.last_engine
        change = float(dt.pow(2).mean().sqrt())  # per-token rms change of the trainer's, since the last checked sync
        followed = aligned = float("nan")
        if change >= FOLLOW_SNR * self.sigma:
            followed = float(de.pow(2).mean().sqrt()) / change
            aligned = float((de * dt).sum() / (de.norm() * dt.norm()).clamp(min=1e-30))
        out = ProbeStats(probe_gap_mean=float(d.mean()), probe_gap_max=float(d.max()), probe_baseline_mean=self.mean,
                         probe_moved_mean=float((t - self.trainer_logp).abs().mean()), probe_followed=followed,
                         probe_aligned=aligned, probe_change_rms=change)
        if not (out.probe_gap_mean <= self.mean + margin and out.probe_gap_max <= 2 * self.max + 4 * margin):
            raise WeightSyncError(
                f"policy {policy!r}: after the weight sync vLLM's log-probs differ from the trainer's by mean "
                f"{out.probe_gap_mean:.3g} (max {out.probe_gap_max:.3g}) nats per probe token, against "
                f"{self.mean:.3g} ({self.max:.3g}) when the engine was built, beyond the margin {margin:g}: the "
                f"engine is not sampling from the trained weights (the trainer's probe log-probs have moved "
                f"{out.probe_moved_mean:.3g} since then; TRL #5312 and verl #7495 are this bug class). Check the "
                "weight names, the LoRA merge and the dtype, or raise model.rollout_engine.init_args.probe_margin "
                "if the growth is numeric noise.")
        if followed == followed and not (followed >= FOLLOW_MIN and aligned >= FOLLOW_MIN):
            raise WeightSyncError(
                f"policy {policy!r}: since the last checked sync the trainer's probe log-probs changed by {change:.3g} "
                f"per token (root mean square) and vLLM's moved {followed:.0%} as far, with cosine {aligned:.2f} to "
                "the trainer's change: the engine is not sampling from the trained weights -- it did not load these "
                "updates (TRL #5312 and verl #7495 are this bug class). Check the weight names and the LoRA merge.")
        if followed == followed:  # the reference moves only when checked: small changes add up until they are
            self.last_trainer, self.last_engine = t, e
        return out
