"""vLLM engine, the parts that need no vLLM: it imports without vllm and says how to install it; records from
vLLM-shaped outputs; the weight stream's names with merged LoRA; the differential probe's arithmetic. The engine
itself runs against the real vLLM in tests/rollout/test_vllm_real.py (the vllm lane)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace as NS

import pytest
import torch

from mutual_rl.data.task import ArithmeticTask, Problem
from mutual_rl.policies.policy import build_policy
from mutual_rl.rollout import get_engine
from mutual_rl.rollout import vllm as V
from mutual_rl.rollout import vllm_sync as S
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


def test_probe_baseline_and_check():
    trainer = [torch.tensor([-1.0, -2.0]), torch.tensor([-0.5])]
    engine = [torch.tensor([-1.1, -2.0]), torch.tensor([-0.2])]  # gaps 0.1, 0, 0.3: mean 0.1333, max 0.3
    base = S.ProbeBaseline.record(trainer, engine, policy="p")
    assert base.mean == pytest.approx(0.4 / 3) and base.max == pytest.approx(0.3)
    moved = [t - 0.05 for t in trainer]  # the trainer moved by 0.05 per token since the engine was built
    synced = [e - 0.05 for e in engine]  # ... and the engine followed: the same gaps as at creation
    m = base.check(moved, synced, 1e-3, policy="p")
    assert m["probe_gap_mean"] == pytest.approx(0.4 / 3) and m["probe_moved_mean"] == pytest.approx(0.05)
    assert m["probe_baseline_mean"] == base.mean and m["probe_gap_max"] == pytest.approx(0.3)
    with pytest.raises(S.WeightSyncError, match="not sampling from the trained weights"):  # stale: gaps 0.05, 0.05, 0.35
        base.check(moved, engine, 1e-3, policy="p")
    assert base.check(moved, engine, 0.06, policy="p")["probe_gap_mean"] == pytest.approx(0.15)  # within margin
    with pytest.raises(S.WeightSyncError):  # NaN fails
        base.check(moved, [torch.full_like(x, float("nan")) for x in engine], 10.0)
    with pytest.raises(S.WeightSyncError, match="did not load the trainer's weights"):
        S.ProbeBaseline.record(trainer, [t + 6.0 for t in trainer])
    with pytest.raises(ValueError, match="shapes differ"):
        base.check(moved, [engine[0], torch.zeros(2)], 1.0)
    assert S.default_margin(torch.float32) == 1e-4 and S.default_margin("bfloat16") == 2e-2
    plp = NS(prompt_logprobs=[None, {4: _lp(-3.0)}, {9: -0.25}])
    assert V.prompt_logprobs_tail(plp, [1, 4, 9], 1).tolist() == [-0.25]


def test_hf_weights_are_plain_names_and_merged_lora(policy):
    import copy

    got = dict(S.hf_weights(policy))
    m = policy.model
    ref = copy.deepcopy(m).merge_and_unload() if hasattr(m, "get_base_model") else m
    want = dict(ref.named_parameters())
    assert set(got) == set(want)
    for k, v in want.items():
        torch.testing.assert_close(got[k], v.detach(), rtol=0, atol=1e-6)
