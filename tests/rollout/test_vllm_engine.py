"""vLLM engine on CPU: imports without vllm, says how to install it, and its pure parts (records from fake vLLM
outputs, weight names incl. merged LoRA, the sync probe) plus the engine's sync/probe logic against a fake
in-process ``vllm`` backed by the HF model. The real engine runs in the GPU test (marked ``gpu``)."""

from __future__ import annotations

import importlib.util
import sys
import types
from types import SimpleNamespace as NS

import pytest
import torch
from transformers import AutoModelForCausalLM

from mutual_rl.data.task import ArithmeticTask, Problem
from mutual_rl.policies.policy import build_policy
from mutual_rl.policies.spec import SamplingSpec
from mutual_rl.rollout import get_engine
from mutual_rl.rollout import vllm as V
from tests.trainer.helpers import TASK, spec

HAS_VLLM = importlib.util.find_spec("vllm") is not None
PROBLEMS = [Problem(1, "3+4=", "7", "add"), Problem(2, "12+34=", "46", "add")]


@pytest.fixture(scope="module", params=[False, True], ids=["full", "lora"])
def policy(request):
    p = build_policy(spec("p", "tiny:gpt2-bpe", lora=request.param), task=ArithmeticTask(**TASK))
    if request.param:  # peft initialises B = 0; make the adapters matter
        torch.manual_seed(1)
        for n, prm in p.model.named_parameters():
            if "lora_B" in n:
                prm.data.normal_(0, 0.05)
    return p


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed")
def test_selecting_vllm_without_it_says_how_to_install():
    with pytest.raises(ImportError, match=r'pip install "mutual-rl\[vllm\]"'):
        get_engine("vllm")


def test_module_imports_without_vllm():
    assert V.INSTALL_HINT == 'pip install "mutual-rl[vllm]"' and callable(V.build_rollouts)


def _lp(x):
    return NS(logprob=x, rank=1, decoded_token=None)


def test_records_from_fake_outputs(policy):
    tok, eos = policy.tokenizer, policy.tokenizer.eos_token_id
    ids_a = tok("12", add_special_tokens=False)["input_ids"]
    ids_b = tok("46 and more", add_special_tokens=False)["input_ids"][:3]
    outs = [NS(outputs=[NS(token_ids=ids_a + [eos], logprobs=[{t: _lp(-0.5)} for t in ids_a + [eos]],
                           finish_reason="stop")]),
            NS(outputs=[NS(token_ids=ids_b, logprobs=[{t: _lp(-1.0), 99: _lp(-2.0)} for t in ids_b],
                           finish_reason="length")])]
    prompts = [policy.render_prompt(p.problem) for p in PROBLEMS]
    groups = V.build_rollouts(policy, PROBLEMS, prompts, [policy.encode_prompt(t) for t in prompts], outs, step=3,
                              group_id_base=10)
    a, b = groups[0][0], groups[1][0]
    assert (a.finish_reason, a.response_text, a.group_id, a.step) == ("eos", "12", 10, 3)
    assert a.response_ids.tolist() == ids_a + [eos] and a.logp.tolist() == [-0.5] * (len(ids_a) + 1)
    assert a.offsets[-1] == (2, 2) and len(a.offsets) == len(a.response_ids)
    assert b.finish_reason == "length" and b.response_text == tok.decode(ids_b) and b.logp.tolist() == [-1.0] * 3
    assert b.prompt_ids.tolist() == policy.encode_prompt(prompts[1]) and b.group_id == 11


def test_records_reject_bad_outputs(policy):
    p = [policy.render_prompt(PROBLEMS[0].problem)]
    ids = [policy.encode_prompt(p[0])]
    bad_stop = [NS(outputs=[NS(token_ids=[5], logprobs=[{5: _lp(-1.0)}], finish_reason="stop")])]
    with pytest.raises(ValueError, match="without the EOS"):
        V.build_rollouts(policy, PROBLEMS[:1], p, ids, bad_stop, step=0)
    no_lp = [NS(outputs=[NS(token_ids=[5], logprobs=None, finish_reason="length")])]
    with pytest.raises(ValueError, match="logprobs=0"):
        V.build_rollouts(policy, PROBLEMS[:1], p, ids, no_lp, step=0)


def test_probe_comparison():
    a = [torch.tensor([-1.0, -2.0]), torch.tensor([-0.5])]
    assert V.compare_probe(a, [x + 1e-5 for x in a], 1e-4)["probe_max_dlogp"] == pytest.approx(1e-5, rel=1e-2)
    with pytest.raises(V.WeightSyncError, match="TRL #5312"):
        V.compare_probe(a, [x + 0.1 for x in a], 1e-2, policy="p")
    with pytest.raises(V.WeightSyncError):
        V.compare_probe(a, [torch.full_like(x, float("nan")) for x in a], 1.0)
    plp = NS(prompt_logprobs=[None, {4: _lp(-3.0)}, {9: -0.25}])
    assert V.prompt_logprobs_tail(plp, [1, 4, 9], 1).tolist() == [-0.25]


def test_hf_weights_are_plain_names_and_merged_lora(policy):
    import copy

    got = dict(V.hf_weights(policy))
    m = policy.model
    ref = copy.deepcopy(m).merge_and_unload() if hasattr(m, "get_base_model") else m
    want = dict(ref.named_parameters())
    assert set(got) == set(want)
    for k, v in want.items():
        torch.testing.assert_close(got[k], v.detach(), rtol=0, atol=1e-6)


# ------------------------------------------------------------------ the engine against a fake in-process vllm
class _FakeLLM:
    broken = False

    def __init__(self, model, **kw):
        self.kw, self.model = kw, AutoModelForCausalLM.from_pretrained(model).eval()
        self.eos = self.model.generation_config.eos_token_id

    def apply_model(self, fn):
        return fn(self)

    def load_weights(self, weights):
        if not _FakeLLM.broken:
            params = dict(self.model.named_parameters())
            for n, t in weights:
                params[n].data.copy_(t)

    def reset_prefix_cache(self):
        pass

    @torch.no_grad()
    def generate(self, prompts, params, use_tqdm=False):
        outs = []
        for p in prompts:
            ids = list(p["prompt_token_ids"])
            if params.prompt_logprobs is not None:
                logp = torch.log_softmax(self.model(torch.tensor([ids])).logits[0, :-1].float(), -1)
                outs.append(NS(prompt_logprobs=[None] + [{t: _lp(float(logp[i, t]))} for i, t in enumerate(ids[1:])]))
                continue
            comps = []
            for _ in range(params.n):
                seq, lps, reason = list(ids), [], "length"
                for _ in range(params.max_tokens):
                    lp = torch.log_softmax(self.model(torch.tensor([seq])).logits[0, -1].float() / params.temperature, -1)
                    t = int(torch.multinomial(lp.exp(), 1))
                    seq.append(t)
                    lps.append({t: _lp(float(lp[t]))})
                    if t == self.eos:
                        reason = "stop"
                        break
                comps.append(NS(token_ids=seq[len(ids):], logprobs=lps, finish_reason=reason))
            outs.append(NS(outputs=comps))
        return outs


class _Params(NS):
    def __init__(self, **kw):
        super().__init__(**{"n": 1, "prompt_logprobs": None, **kw})


@pytest.fixture
def fake_vllm(monkeypatch):
    mod = types.ModuleType("vllm")
    mod.LLM, mod.SamplingParams = _FakeLLM, _Params
    monkeypatch.setitem(sys.modules, "vllm", mod)
    _FakeLLM.broken = False
    yield mod
    _FakeLLM.broken = False


def test_engine_generate_sync_and_probe(policy, fake_vllm):
    torch.manual_seed(0)
    engine = V.VLLMRolloutEngine(probe_tolerance=1e-4, per_policy={"p": {"gpu_memory_utilization": 0.2}})
    groups = engine.generate(policy, PROBLEMS, SamplingSpec(n=3, max_new_tokens=4), step=0)
    held = engine.llms["p"]
    assert held.llm.kw["logprobs_mode"] == "processed_logprobs" and held.llm.kw["gpu_memory_utilization"] == 0.2
    assert [len(g) for g in groups] == [3, 3]
    for r in (r for g in groups for r in g):  # the engine's trace equals the trainer's tempered log-probs
        ids = torch.cat([r.prompt_ids, r.response_ids]).unsqueeze(0)
        want, _ = policy.response_logp(ids, torch.ones_like(ids), len(r.response_ids), 1.0)
        torch.testing.assert_close(r.logp, want[0].detach(), rtol=0, atol=1e-4)
    before = {k: v.detach().clone() for k, v in policy.model.named_parameters()}
    try:
        with torch.no_grad():
            for prm in policy.model.parameters():
                if prm.requires_grad:
                    prm.add_(torch.randn_like(prm) * 0.05)
        policy.version += 1
        m = engine.sync_weights(policy)
        assert m["probe_max_dlogp"] <= 1e-4 and m["sync_s"] >= 0 and held.version == policy.version
        with torch.no_grad():
            for prm in policy.model.parameters():
                if prm.requires_grad:
                    prm.add_(torch.randn_like(prm) * 0.05)
        policy.version += 1
        _FakeLLM.broken = True  # a sync that silently loads nothing
        with pytest.raises(V.WeightSyncError, match="differ from the trainer"):
            engine.sync_weights(policy)
    finally:
        with torch.no_grad():
            for k, v in policy.model.named_parameters():
                v.copy_(before[k])


def test_placement_agrees_with_config_and_is_fixed_once_built(policy, fake_vllm):
    engine = V.VLLMRolloutEngine(per_policy={"a": {"device": 0}})
    engine.place("a", 0)
    assert engine.placement == {"a": 0}
    with pytest.raises(ValueError, match="per_policy.a.device is 0"):
        engine.place("a", 1)
    engine.place("p", "colocate")
    engine.generate(policy, PROBLEMS[:1], SamplingSpec(n=1, max_new_tokens=2), step=0)
    assert engine.llms["p"].device is None
    engine.place("p", "colocate")  # unchanged: fine
    with pytest.raises(ValueError, match="cannot change during a run"):
        engine.place("p", 1)


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and HAS_VLLM), reason="needs a CUDA GPU and vllm")
def test_real_vllm_sync_probe(policy):  # pragma: no cover - GPU only
    policy.to(torch.device(torch.cuda.current_device()))
    engine = V.VLLMRolloutEngine(gpu_memory_utilization=0.1, enforce_eager=True, dtype="float32")
    groups = engine.generate(policy, PROBLEMS, SamplingSpec(n=4, max_new_tokens=6), step=0)
    assert [len(g) for g in groups] == [4, 4]
    with torch.no_grad():
        for prm in policy.model.parameters():
            if prm.requires_grad:
                prm.add_(torch.randn_like(prm) * 0.01)
    policy.version += 1
    assert engine.sync_weights(policy)["probe_max_dlogp"] <= 1e-3
