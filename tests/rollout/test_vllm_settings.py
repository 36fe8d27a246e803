"""The vLLM engine's settings that need no running engine (the engine object is built with vLLM's import stubbed
out; nothing is generated): pipeline / tensor parallelism refused, gpu_memory_utilization auto or a fraction, the
engine dtype following the trainer's compute dtype (bf16 under bf16-mixed) while the probe's margin follows the
dtypes the probe computes in, and PolicySpec.dtype bfloat16 warned like bf16-true."""

from __future__ import annotations

import pytest
import torch

import mutual_rl.rollout.vllm as V
from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import PolicySpec
from tests.module.helpers import TASK, spec


@pytest.fixture
def engine_cls(monkeypatch):
    monkeypatch.setattr(V, "import_vllm", lambda: None)
    return V.VLLMRolloutEngine


@pytest.mark.parametrize("key", ["tensor_parallel_size", "pipeline_parallel_size"])
def test_model_parallel_engines_are_refused(engine_cls, key):
    with pytest.raises(ValueError, match=f"{key} > 1 is not supported"):
        engine_cls(llm_kwargs={key: 2})
    engine_cls(llm_kwargs={key: 1})


@pytest.mark.parametrize("value", [0, 1.5, "half", True])
def test_utilization_is_auto_or_a_fraction(engine_cls, value):
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        engine_cls(gpu_memory_utilization=value)
    with pytest.raises(ValueError, match=r"per_policy\['a'\].gpu_memory_utilization"):
        engine_cls(per_policy={"a": {"gpu_memory_utilization": value}})


def test_engine_dtype_follows_the_trainers_compute_dtype(engine_cls):
    policy = build_policy(spec("p", "tiny:gpt2-bpe"), task=ArithmeticTask(**TASK))
    engine = engine_cls()
    assert engine.defaults["gpu_memory_utilization"] == "auto"
    args = engine.resolved_args(policy)
    assert (args["dtype"], args["gpu_memory_utilization"]) == ("float32", "auto")  # fp32 run: fp32 engine
    policy.autocast_dtype = torch.bfloat16  # trainer.precision bf16-mixed (memory/fit.py sets it at fit start)
    assert engine.resolved_args(policy)["dtype"] == "bfloat16"
    assert engine._dtypes_half(policy)  # the probe's half-precision margin applies
    fp32 = engine_cls(dtype="float32")
    assert fp32.resolved_args(policy)["dtype"] == "float32"  # explicit: kept
    # the probe's trainer forward runs outside autocast: float32 against a float32 engine, the float32 margin
    assert not fp32._dtypes_half(policy) and fp32.margin(policy) == 1e-4
    assert engine_cls(dtype="half")._dtypes_half(policy)  # vLLM's name for float16
    engine.set_planned_utilization({"p": 0.21})
    assert engine.resolved_args(policy)["gpu_memory_utilization"] == 0.21
    fixed = engine_cls(per_policy={"p": {"gpu_memory_utilization": 0.4}})
    fixed.set_planned_utilization({"p": 0.21})
    assert fixed.resolved_args(policy)["gpu_memory_utilization"] == 0.4  # only auto takes the plan's


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_policy_dtype_warns_like_bf16_true(dtype):
    with pytest.warns(UserWarning, match="no float32 master copy"):
        PolicySpec(name="p", model="org/m", dtype=dtype)


def test_float32_policy_dtype_does_not_warn(recwarn):
    PolicySpec(name="p", model="org/m", dtype="float32")
    assert not [w for w in recwarn if "master copy" in str(w.message)]
