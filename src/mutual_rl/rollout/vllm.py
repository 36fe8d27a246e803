"""Rollouts with vLLM (GPU): one ``vllm.LLM`` per policy, same records as the HF engine, verified weight sync.

This module imports without vllm (``mutual_rl.rollout`` imports it so that ``class_path: VLLMRolloutEngine``
resolves); vllm itself is imported when an engine is built, which raises an ``ImportError`` naming
``pip install "mutual-rl[vllm]"`` when vllm is missing.

What is implemented:

* **One engine per policy** (``self.llms[name]``), created on first use from the policy's *current* weights
  (exported to a temporary Hugging Face folder: merged weights for LoRA), in-process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so weights can be loaded directly). Colocated with training by
  default: ``gpu_memory_utilization`` (fraction of the GPU each policy's engine may take) and
  ``enable_sleep_mode`` (engine sleeps -- weights offloaded, KV cache freed -- between its generations) are
  engine-wide and overridable per policy (``per_policy: {name: {gpu_memory_utilization: ...}}``). A policy
  placed on another device (MWRA ``placement: <index>``, which the module passes to :meth:`place` every step, or
  ``per_policy.<name>.device``) has its engine built under that current device; the two must agree, and a
  placement cannot change once the policy's engine exists. This path is *not verified* on hardware.
* **Sampling and log-probs**: ``SamplingParams(n, temperature, top_p, top_k (0 = off), max_tokens,
  logprobs=0)`` -- ``logprobs=0`` returns the log-prob of each *sampled* token -- and the engine is built with
  ``logprobs_mode="processed_logprobs"``, so those are log-probs of the distribution the token was drawn from
  (temperature, top-k and top-p applied), as the HF engine's and as the trainer's tempered ``response_logp``
  with ``top_p = 1`` (vLLM's default ``raw_logprobs`` would return untempered log-probs). ``generation_config
  ="vllm"`` stops vLLM from applying the model's ``generation_config.json`` defaults.
* **Records** (:func:`build_rollouts`, pure): sampled ids (vLLM keeps the EOS id in ``token_ids`` when it stops
  on EOS), log-probs, finish reason ``eos``/``length``, response text decoded with special tokens skipped, char
  offsets via ``offsets_by_decoding`` -- exactly as ``rollout/hf.py``.
* **Weight sync** (``sync_weights(policy) -> dict``, called by the module after each update): the policy's
  weights under their Hugging Face names (:func:`hf_weights`; LoRA: ``W + scale * B @ A`` computed per layer
  with peft's ``get_delta_weight``, the training weights untouched; FSDP: gathered with ``summon_full_params``)
  go to ``model.load_weights`` in the engine (``LLM.apply_model``; older vLLM: the driver worker's model), then
  the prefix cache is reset (cached KV of the old weights would be reused otherwise).
* **Verified**: after every sync (``probe_every``) a log-prob probe scores fixed prompt+response pairs with vLLM
  (``prompt_logprobs=0``, temperature 1) and with the trainer's ``policy.response_logp`` (temperature 1);
  :func:`compare_probe` raises :class:`WeightSyncError` when ``max |Δ logp|`` exceeds ``probe_tolerance``
  (default 1e-3 for fp32 engines, 5e-2 for bf16/fp16) -- the silent stale-weights bug class of TRL #5312 and
  verl #7495.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mutual_rl.data.task import Problem
from mutual_rl.policies.spec import SamplingSpec
from mutual_rl.rollout.base import RolloutEngine
from mutual_rl.strategies import clean_name
from mutual_rl.thl.offsets import offsets_by_decoding
from mutual_rl.types import Rollout

INSTALL_HINT = 'pip install "mutual-rl[vllm]"'
#: (prompt text, response text) pairs of the weight-sync probe: short fixed text, no task's format or content
#: (the prompt goes through the policy's ``encode_prompt``, so its chat template and BOS apply)
PROBE_TEXTS = (
    ("The quick brown fox", " jumps over the lazy dog."),
    ("Hello, world", "! How are you today?"),
    ("Name three colours:", " red, green and blue."),
)


class WeightSyncError(RuntimeError):
    """vLLM's log-probs after a weight sync differ from the trainer's: the engine samples from other weights."""


def import_vllm():
    """``vllm`` or an ImportError saying how to install it."""
    try:
        import vllm
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"rollout_engine 'vllm' needs vLLM (CUDA GPUs only): {INSTALL_HINT}. On CPU use "
                          "rollout_engine: hf.") from e
    return vllm


# ------------------------------------------------------------------------------------------ pure parts
def sampled_logprob(entry, token_id: int) -> float:
    """The log-prob of ``token_id`` in one position of vLLM's ``logprobs`` (``{id: Logprob}`` or floats)."""
    value = entry[token_id]
    return float(getattr(value, "logprob", value))


def build_rollouts(
    policy, problems: Sequence[Problem], prompts: Sequence[str], prompt_ids: Sequence[list[int]], outputs,
    *, step: int, group_id_base: int = 0,
) -> list[list[Rollout]]:
    """:class:`Rollout` records from vLLM ``RequestOutput``\\ s (one per problem, ``n`` completions each).

    Each completion needs ``token_ids``, ``logprobs`` (one ``{id: Logprob}`` per sampled token) and
    ``finish_reason`` (``stop`` on EOS, ``length``).
    """
    if len(outputs) != len(problems):
        raise ValueError(f"vLLM returned {len(outputs)} request outputs for {len(problems)} prompts.")
    tok, eos = policy.tokenizer, policy.tokenizer.eos_token_id
    out: list[list[Rollout]] = []
    for i, (problem, req) in enumerate(zip(problems, outputs)):
        group = []
        for c in req.outputs:
            ids = [int(t) for t in c.token_ids]
            if c.logprobs is None or len(c.logprobs) != len(ids):
                raise ValueError("vLLM completion without one log-prob per sampled token; sample with "
                                 "SamplingParams(logprobs=0).")
            stopped = bool(ids) and ids[-1] == eos
            if c.finish_reason == "stop" and not stopped:
                raise ValueError(f"vLLM stopped (finish_reason 'stop') without the EOS id {eos} as last token; "
                                 "stop strings / other stop ids are not supported (they break the RL trace).")
            logp = torch.tensor([sampled_logprob(e, t) for e, t in zip(c.logprobs, ids)], dtype=torch.float32)
            body = ids[:-1] if stopped else ids
            text = tok.decode(body, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            offsets = tuple(offsets_by_decoding(tok, body, text))
            if stopped:
                offsets = offsets + ((len(text), len(text)),)
            group.append(Rollout(
                policy_id=policy.name, prompt_id=problem.prompt_id, group_id=group_id_base + i, step=step,
                policy_version=policy.version, prompt_text=prompts[i], response_text=text,
                prompt_ids=torch.tensor(prompt_ids[i], dtype=torch.long),
                response_ids=torch.tensor(ids, dtype=torch.long), logp=logp, offsets=offsets,
                finish_reason="eos" if stopped else "length",
            ))
        out.append(group)
    return out


def prompt_logprobs_tail(request_output, token_ids: Sequence[int], width: int) -> torch.Tensor:
    """The last ``width`` prompt log-probs [width] of a ``prompt_logprobs`` request over ``token_ids``."""
    plp = request_output.prompt_logprobs
    if plp is None or len(plp) != len(token_ids):
        raise ValueError("vLLM returned no prompt log-probs for every prompt token (use prompt_logprobs=0).")
    tail = list(zip(plp, token_ids))[len(token_ids) - width:]
    return torch.tensor([sampled_logprob(e, t) for e, t in tail], dtype=torch.float32)


def compare_probe(trainer_logp: Sequence[torch.Tensor], engine_logp: Sequence[torch.Tensor], tolerance: float,
                  *, policy: str = "?") -> dict[str, float]:
    """``{probe_max_dlogp, probe_mean_dlogp}`` over all probe tokens; :class:`WeightSyncError` above tolerance."""
    if len(trainer_logp) != len(engine_logp) or not trainer_logp:
        raise ValueError("probe: need the same, non-zero number of trainer and engine rows.")
    diffs = []
    for a, b in zip(trainer_logp, engine_logp):
        if a.shape != b.shape:
            raise ValueError(f"probe: shapes differ ({tuple(a.shape)} vs {tuple(b.shape)}).")
        diffs.append((a.float().cpu() - b.float().cpu()).abs())
    d = torch.cat(diffs)
    out = {"probe_max_dlogp": float(d.max()), "probe_mean_dlogp": float(d.mean())}
    if not out["probe_max_dlogp"] <= tolerance:  # NaN fails too
        raise WeightSyncError(
            f"policy {policy!r}: after weight sync vLLM's log-probs differ from the trainer's by max "
            f"{out['probe_max_dlogp']:.3g} (mean {out['probe_mean_dlogp']:.3g}) > tolerance {tolerance:g}: the "
            "engine is not sampling from the trained weights (see TRL #5312, verl #7495). Check the weight names, "
            "LoRA merge and dtype, or raise model.rollout_engine.init_args.probe_tolerance if the gap is numeric noise.")
    return out


@torch.no_grad()
def hf_weights(policy) -> list[tuple[str, torch.Tensor]]:
    """The policy's parameters as a plain Hugging Face model's ``(name, tensor)`` list (what vLLM loads).

    Parameters only (tied ones once; vLLM ties them itself), wrapper components removed from names. LoRA
    (peft): each adapted layer's base weight plus its delta ``get_delta_weight`` (``scale * B @ A``, transposed
    for ``fan_in_fan_out`` layers), adapter tensors dropped, ``base_layer.`` removed; the training weights are
    not modified. Under FSDP the full parameters are gathered first (a collective: every rank calls this).
    """
    from mutual_rl.strategies import full_params

    model = policy.model
    with full_params(model):
        lora = hasattr(model, "get_base_model")
        base = model.get_base_model() if lora else model
        deltas = {}
        if lora:
            from peft.tuners.lora import LoraLayer

            for name, mod in base.named_modules():
                if isinstance(mod, LoraLayer):
                    active = [a for a in mod.active_adapters if a in mod.lora_A]
                    if active and not getattr(mod, "merged", False):
                        deltas[clean_name(name)] = sum(mod.get_delta_weight(a) for a in active)
        out = []
        for key, value in base.named_parameters():
            name = clean_name(key)
            if "lora_" in name:
                continue
            name = name.replace(".base_layer.", ".")
            value = value.detach().clone()
            owner = name.rsplit(".", 1)[0]
            if name.endswith(".weight") and owner in deltas:
                value += deltas[owner].to(value.dtype)
            out.append((name, value))
        return out


def probe_pairs(policy) -> list[tuple[list[int], list[int]]]:
    """Fixed (prompt ids, response ids) pairs of :data:`PROBE_TEXTS` for the sync probe, independent of the task:
    the prompt text is encoded as a prompt of the policy (``encode_prompt``: chat template, BOS), the response
    without special tokens."""
    pairs = []
    for prompt_text, response in PROBE_TEXTS:
        prompt = policy.encode_prompt(prompt_text)
        resp = policy.tokenizer(response, add_special_tokens=False)["input_ids"]
        pairs.append((list(prompt), list(resp)))
    return pairs


@torch.no_grad()
def trainer_probe_logp(policy, pairs) -> list[torch.Tensor]:
    """The trainer's log-probs (temperature 1) of each pair's response tokens."""
    out, was_training = [], policy.model.training
    policy.model.eval()  # no dropout in the probe
    try:
        for prompt, resp in pairs:
            ids = torch.tensor([prompt + resp], device=policy.device)
            logp, _ = policy.response_logp(ids, torch.ones_like(ids), len(resp), 1.0)
            out.append(logp[0].float().cpu())
    finally:
        policy.model.train(was_training)
    return out


# ----------------------------------------------------------------------------------------------- engine
@dataclass
class _Held:
    llm: object
    version: int
    tmpdir: object
    sleeping: bool = False
    device: int | None = None


class VLLMRolloutEngine(RolloutEngine):
    """One ``vllm.LLM`` per policy; ``generate`` as the HF engine; ``sync_weights`` verified by a probe."""

    def __init__(
        self,
        gpu_memory_utilization: float = 0.3,
        enable_sleep_mode: bool = False,
        dtype: str = "auto",
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        seed: int = 0,
        probe_tolerance: float | None = None,
        probe_every: int = 1,
        per_policy: dict[str, dict] | None = None,
        llm_kwargs: dict | None = None,
    ):
        """
        Args:
            gpu_memory_utilization: fraction of the GPU each policy's engine may use (weights + KV cache).
            enable_sleep_mode: engines sleep between generations, freeing memory for training (colocated).
            dtype: engine dtype (auto: the checkpoint's; bfloat16 for real models).
            max_model_len: longest prompt + response (default: the model's).
            enforce_eager: disable CUDA graphs (faster start-up for tiny models).
            seed: engine sampling seed.
            probe_tolerance: max allowed |Δ logp| of the sync probe (default 1e-3 fp32, 5e-2 bf16/fp16).
            probe_every: run the probe after every k-th sync (0 = never; not recommended).
            per_policy: per-policy overrides of the keys above and device (index).
            llm_kwargs: extra vllm.LLM keyword arguments (e.g. tensor_parallel_size).
        """
        import_vllm()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine core: direct loads
        self.defaults = dict(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode,
                             dtype=dtype, max_model_len=max_model_len, enforce_eager=enforce_eager, seed=seed)
        self.probe_tolerance, self.probe_every = probe_tolerance, probe_every
        self.per_policy, self.llm_kwargs = dict(per_policy or {}), dict(llm_kwargs or {})
        self.llms: dict[str, _Held] = {}
        self._syncs: dict[str, int] = {}
        self.placement: dict[str, int | None] = {}

    def place(self, name: str, placement: str | int) -> None:
        """MWRA placement of policy ``name``'s engine: ``"colocate"`` (the current device, or
        ``per_policy.<name>.device``) or a device index. Conflicts and changes after creation are errors."""
        device = None if placement == "colocate" else int(placement)
        configured = self.per_policy.get(name, {}).get("device")
        if device is not None and configured is not None and int(configured) != device:
            raise ValueError(f"policy {name!r}: MWRA placement puts its rollouts on device {device} but "
                             f"model.rollout_engine.init_args.per_policy.{name}.device is {configured}; set one of them.")
        held = self.llms.get(name)
        want = device if device is not None else configured
        if held is not None and held.device != want:
            raise ValueError(f"policy {name!r}: its vLLM engine runs on device {held.device}, placement now asks for "
                             f"{want}; a placement cannot change during a run.")
        self.placement[name] = device
    def _args(self, name: str) -> dict:
        unknown = set(self.per_policy.get(name, {})) - set(self.defaults) - {"device"}
        if unknown:
            raise ValueError(f"vllm per_policy[{name!r}]: unknown keys {sorted(unknown)}.")
        return {**self.defaults, **self.per_policy.get(name, {})}

    def _engine(self, policy) -> _Held:
        held = self.llms.get(policy.name)
        if held is None:
            vllm = import_vllm()
            args = self._args(policy.name)
            device = args.pop("device", None)
            if self.placement.get(policy.name) is not None:
                device = self.placement[policy.name]
            tmp = tempfile.TemporaryDirectory(prefix=f"mutual_rl_vllm_{policy.name}_")
            base = policy.model.get_base_model() if hasattr(policy.model, "get_base_model") else policy.model
            weights = dict(hf_weights(policy))
            base.save_pretrained(tmp.name, state_dict=weights)
            policy.tokenizer.save_pretrained(tmp.name)
            ctx = torch.cuda.device(device) if device is not None else contextlib.nullcontext()
            with ctx:
                llm = vllm.LLM(model=tmp.name, logprobs_mode="processed_logprobs", generation_config="vllm",
                               **{k: v for k, v in args.items() if v is not None}, **self.llm_kwargs)
            held = self.llms[policy.name] = _Held(llm, policy.version, tmp, device=device)
            self._probe(policy, held)
        self._wake(held)
        return held

    def _wake(self, held: _Held) -> None:
        if held.sleeping:
            held.llm.wake_up()
            held.sleeping = False

    def _maybe_sleep(self, name: str, held: _Held) -> None:
        if self._args(name)["enable_sleep_mode"]:
            held.llm.sleep(level=1)
            held.sleeping = True

    @torch.no_grad()
    def generate(self, policy, problems: Sequence[Problem], sampling: SamplingSpec, *, step: int,
                 group_id_base: int = 0) -> list[list[Rollout]]:
        vllm = import_vllm()
        held = self._engine(policy)
        if held.version != policy.version:  # e.g. restored from a checkpoint, or updated without a sync call
            self._load(policy, held)
        prompts = [policy.render_prompt(p.problem) for p in problems]
        prompt_ids = [policy.encode_prompt(t) for t in prompts]
        params = vllm.SamplingParams(n=sampling.n, temperature=sampling.temperature, top_p=sampling.top_p,
                                     top_k=sampling.top_k, max_tokens=sampling.max_new_tokens, logprobs=0,
                                     stop_token_ids=[policy.tokenizer.eos_token_id])
        outputs = held.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        self._maybe_sleep(policy.name, held)
        return build_rollouts(policy, problems, prompts, prompt_ids, outputs, step=step, group_id_base=group_id_base)

    def sync_weights(self, policy) -> dict[str, float]:
        """Push the policy's current weights into its engine and verify them; returns ``sync_s`` and probe metrics."""
        held = self.llms.get(policy.name)
        if held is None:  # not created yet: it will be built from the current weights on first use
            return {}
        self._wake(held)
        t0 = time.perf_counter()
        metrics = self._load(policy, held)
        metrics["sync_s"] = time.perf_counter() - t0
        self._maybe_sleep(policy.name, held)
        return metrics

    def _load(self, policy, held: _Held) -> dict[str, float]:
        weights = hf_weights(policy)
        llm = held.llm
        if hasattr(llm, "apply_model"):
            llm.apply_model(lambda model: model.load_weights(weights))
        else:  # older vLLM
            llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(weights)
        if hasattr(llm, "reset_prefix_cache"):
            llm.reset_prefix_cache()
        held.version = policy.version
        self._syncs[policy.name] = self._syncs.get(policy.name, 0) + 1
        if self.probe_every and self._syncs[policy.name] % self.probe_every == 0:
            return self._probe(policy, held)
        return {}

    def _probe(self, policy, held: _Held) -> dict[str, float]:
        vllm = import_vllm()
        pairs = probe_pairs(policy)
        params = vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
        outs = held.llm.generate([{"prompt_token_ids": p + r} for p, r in pairs], params, use_tqdm=False)
        engine = [prompt_logprobs_tail(o, p + r, len(r)) for o, (p, r) in zip(outs, pairs)]
        return compare_probe(trainer_probe_logp(policy, pairs), engine, self.tolerance(policy), policy=policy.name)

    def tolerance(self, policy) -> float:
        if self.probe_tolerance is not None:
            return self.probe_tolerance
        dtype = str(self._args(policy.name)["dtype"])
        if dtype == "auto":
            dtype = str(next(policy.model.parameters()).dtype)
        return 1e-3 if "32" in dtype else 5e-2
