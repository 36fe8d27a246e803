"""Against the real vLLM (its CPU backend; the vllm lane): greedy evaluation through the engine gives Hugging Face
greedy decoding's texts, with the current weights after an update, and the evaluator decodes through it; the
sampled log-probs of the engine's own requests come from vLLM's flat columns (``SamplingParams.flat_logprobs``).
(The engine's dtype following the trainer's autocast dtype: test_vllm_real.py::test_fit_through_the_vllm_engine.)
Skipped where vLLM is not installed."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.evaluation.greedy import greedy_generate
from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import SamplingSpec
from mutual_rl.types import Problem
from tests.module.helpers import TASK, spec

HAS_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM (the vllm lane of .ci/run)")]
PROBLEMS = [Problem(1, "3+4=", "7", "add"), Problem(2, "12+34=", "46", "add"), Problem(3, "71-5=", "66", "sub"),
            Problem(4, "9+9=", "18", "add")]
KV = 32 * 2**20


@pytest.fixture(scope="module")
def engine():
    from mutual_rl.rollout import vllm as V

    return V.VLLMRolloutEngine(enforce_eager=True, kv_cache_memory_bytes=KV)


@pytest.mark.parametrize("model", ["tiny:gpt2-bpe", "tiny:llama-char"])
def test_greedy_through_the_engine_equals_hf_greedy(engine, model):
    policy = build_policy(spec(model.split(":")[1].split("-")[0], model), task=ArithmeticTask(**TASK))
    before = engine.generate_greedy(policy, PROBLEMS, 8)
    assert before == greedy_generate(policy, PROBLEMS, 8)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # an update the engine must follow before it decodes
        for prm in policy.model.parameters():
            prm.add_(torch.randn(prm.shape, generator=g) * 0.05)
    policy.version += 1
    after = engine.generate_greedy(policy, PROBLEMS, 8)
    assert after == greedy_generate(policy, PROBLEMS, 8)
    assert after != before  # the update changes the texts: an engine with the old weights would fail the check


def test_greedy_evaluation_decodes_through_the_engine(engine, monkeypatch):
    """Evaluator with the vLLM engine and temperature 0: the greedy texts come from generate_greedy (Hugging Face
    generate is not called), and the metrics are those of Hugging Face greedy decoding's texts."""
    from mutual_rl.evaluation import validation

    policy = build_policy(spec("llama_eval", "tiny:llama-char"), task=ArithmeticTask(**TASK))
    want = greedy_generate(policy, PROBLEMS, 8)
    expected = sum(t.startswith("11") for t in want) / len(want)
    assert 0 < expected < 1  # the reward below tells these texts apart

    def starts_11(completion: str, answer: str) -> float:
        return float(completion.startswith("11"))

    def no_hf(*args, **kwargs):
        raise AssertionError("greedy evaluation with the vLLM engine must decode through the engine")

    monkeypatch.setattr(validation, "greedy_generate", no_hf)
    ev = validation.Evaluator(validation.EvalConfig(k=2, temperature=0, max_new_tokens=8), starts_11, engine)
    ev.start(0)
    ev.add(policy, PROBLEMS)
    out = ev.finish()["llama_eval"]
    assert out["greedy"] == out["pass@1"] == expected


def test_sampled_logprobs_come_from_flat_columns(engine, monkeypatch):
    policy = build_policy(spec("gpt2f", "tiny:gpt2-bpe"), task=ArithmeticTask(**TASK))
    held = engine.ensure(policy)
    seen, generate = [], held.llm.generate

    def recording(*args, **kwargs):  # the engine's own request outputs
        outputs = generate(*args, **kwargs)
        seen.extend(c.logprobs for o in outputs for c in o.outputs)
        return outputs

    monkeypatch.setattr(held.llm, "generate", recording)
    torch.manual_seed(0)
    groups = engine.generate(policy, PROBLEMS[:2], SamplingSpec(n=2, max_new_tokens=6), step=0)
    assert len(seen) == 4 and {type(lp).__name__ for lp in seen} == {"FlatLogprobs"}
    for r in (r for grp in groups for r in grp):
        ids = torch.cat([r.prompt_ids, r.response_ids]).unsqueeze(0)
        want, _ = policy.response_logp(ids, torch.ones_like(ids), len(r.response_ids), 1.0)
        assert float((r.logp - want[0].detach()).abs().max()) <= 1e-5
