"""vLLM engine, the parts that need no vLLM: it imports without vllm and says how to install it; records from
vLLM-shaped outputs; the weight stream's names with merged LoRA; the differential probe's arithmetic. The engine
itself runs against the real vLLM in tests/rollout/test_vllm_real.py (the vllm lane)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace as NS

import pytest
import torch

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.policy import build_policy
from mutual_rl.rollout import get_engine
from mutual_rl.rollout import vllm as V
from mutual_rl.rollout import vllm_sync as S
from mutual_rl.types import Problem
from tests.module.helpers import TASK, spec

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


def _rows(*values):
    return [torch.tensor(values[:2]), torch.tensor(values[2:])]


def test_probe_baseline_and_gap_check():
    trainer, engine = _rows(-1.0, -2.0, -0.5), _rows(-1.1, -2.0, -0.2)  # gaps 0.1, 0, 0.3
    base = S.ProbeBaseline.record(trainer, engine, policy="p", limit=5.0)
    assert base.mean == pytest.approx(0.4 / 3) and base.max == pytest.approx(0.3)
    assert base.sigma == pytest.approx((0.1 / 3) ** 0.5)  # root mean square of the differences
    moved, synced = _rows(-2.0, -3.0, -1.5), _rows(-2.1, -3.0, -1.2)  # both moved by -1 per token
    m = base.check(moved, synced, 1e-3, policy="p")
    assert m.probe_gap_mean == pytest.approx(0.4 / 3) and m.probe_moved_mean == pytest.approx(1.0)
    assert m.probe_followed == pytest.approx(1.0) and m.probe_change_rms == pytest.approx(1.0)
    stale = _rows(-1.1, -2.0, -0.2)
    base2 = S.ProbeBaseline.record(trainer, engine, limit=5.0)
    with pytest.raises(S.WeightSyncError, match="not sampling from the trained weights"):  # gaps 0.9, 1.0, 1.3
        base2.check(moved, stale, 1e-3, policy="p")
    with pytest.raises(S.WeightSyncError):  # NaN fails
        base2.check(moved, [torch.full_like(x, float("nan")) for x in engine], 10.0)
    with pytest.raises(S.WeightSyncError, match="did not load the trainer's weights"):
        S.ProbeBaseline.record(trainer, [t + 6.0 for t in trainer], limit=5.0)
    with pytest.raises(S.WeightSyncError, match=r"above 0.01"):  # the float32 limit (S.baseline_limit(False))
        S.ProbeBaseline.record(trainer, engine, limit=S.baseline_limit(False))
    assert S.baseline_limit(True) == 0.5
    with pytest.raises(ValueError, match="shapes differ"):
        base2.check(moved, [engine[0], torch.zeros(2)], 1.0)
    assert S.default_margin(False) == 1e-4 and S.default_margin(True) == 2e-2
    assert S.default_margin(True, 0.043) == 0.043  # half precision: at least the gap at creation
    assert S.is_half(torch.float32, "bfloat16") and not S.is_half("float32", torch.float32)


def test_probe_followed_check():
    trainer, engine = _rows(-1.0, -2.0, -0.5), _rows(-1.1, -2.0, -0.2)  # sigma 0.183: checked from 0.365 per token
    moved = _rows(-2.0, -3.0, -1.5)
    base = S.ProbeBaseline.record(trainer, engine, limit=5.0)
    with pytest.raises(S.WeightSyncError, match="moved 0% as far"):  # stale; the gap check passes at margin 2
        base.check(moved, engine, 2.0, policy="p")
    half = _rows(-1.5, -2.4, -0.6)  # the engine moved 0.4 per token where the trainer moved 1
    with pytest.raises(S.WeightSyncError, match="moved 40% as far"):
        base.check(moved, half, 2.0, policy="p")
    wrong = _rows(-0.1, -1.0, 0.8)  # as far, the other way
    with pytest.raises(S.WeightSyncError, match="cosine -1.00"):
        base.check(moved, wrong, 2.0, policy="p")
    nudged = _rows(-1.2, -2.2, -0.7)  # 0.2 per token, below 0.365: not checked, and the reference stays put ...
    m = base.check(nudged, engine, 2.0, policy="p")
    assert m.probe_followed != m.probe_followed and m.probe_change_rms == pytest.approx(0.2)
    with pytest.raises(S.WeightSyncError, match="moved 0% as far"):  # ... so a stale engine is caught once the
        base.check(_rows(-1.4, -2.4, -0.9), engine, 2.0, policy="p")  # changes add up to 0.4 per token
    synced = _rows(-1.5, -2.4, -0.6)  # the engine followed the 0.4 (measured from creation)
    m = base.check(_rows(-1.4, -2.4, -0.9), synced, 2.0)
    assert m.probe_followed == pytest.approx(1.0) and m.probe_aligned == pytest.approx(1.0)


def test_prompt_logprobs_tail():
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
