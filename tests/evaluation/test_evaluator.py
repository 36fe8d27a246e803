"""Evaluator end to end: scripted responses with hand-derived metrics, a tiny preset policy, greedy decoding."""

from __future__ import annotations

import json
import math
import random
from types import SimpleNamespace

import pytest
import torch

import mutual_rl.evaluation.validation as validation
from mutual_rl.data.task import ArithmeticTask
from mutual_rl.evaluation import EvalConfig, Evaluator, evaluate_file, greedy_generate
from mutual_rl.evaluation.greedy import decode_completion
from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import SamplingSpec
from mutual_rl.rewards import integer_match
from mutual_rl.rollout.hf import HFRolloutEngine
from mutual_rl.types import Problem
from tests.module.helpers import TASK, spec

PROBLEMS = [Problem(1, "2+3=", "5", "add"), Problem(2, "7-4=", "3", "sub")]
SAMPLES = {  # policy -> prompt_id -> k = 4 responses
    "A": {1: ["5", "5", "6", ""], 2: ["4", "4", "3", "x"]},
    "B": {1: ["6", "7", "6", "7"], 2: ["3", "\\boxed{3}", "4", "4"]},
}
GREEDY = {"A": {1: "5", 2: "0"}, "B": {1: "5", 2: "3"}}


class ScriptedEngine:
    def generate(self, policy, problems, sampling, *, step):
        assert sampling.n == 4 and step == -1
        return [[SimpleNamespace(response_text=t) for t in SAMPLES[policy.name][p.prompt_id]] for p in problems]


def fake_policy(name):
    return SimpleNamespace(name=name, spec=SimpleNamespace(sampling=SamplingSpec(max_new_tokens=5)),
                           device=torch.device("cpu"))


def test_scripted_metrics(monkeypatch):
    monkeypatch.setattr(validation, "greedy_generate",
                        lambda policy, problems, n, bs: [GREEDY[policy.name][p.prompt_id] for p in problems])
    ev = Evaluator(EvalConfig(k=4), integer_match, ScriptedEngine())
    ev.start(0)
    for name in ("A", "B"):
        for p in PROBLEMS:  # one problem per batch: accumulation across batches
            ev.add(fake_policy(name), [p])
    out = ev.finish()
    a, b = out["A"], out["B"]
    assert a["pass@1"] == pytest.approx((2 / 4 + 1 / 4) / 2) and b["pass@1"] == pytest.approx((0 + 2 / 4) / 2)
    assert a["pass@4"] == 1.0 and b["pass@4"] == 0.5
    assert a["maj@4"] == 0.5  # add: "5" wins (2 votes, "" does not vote); sub: "4" wins
    assert b["maj@4"] == 0.25  # add: 6/7 tie, both wrong; sub: "3" (incl. \boxed{3}) ties "4" -> 0.5
    assert a["greedy"] == 0.5 and b["greedy"] == 1.0
    assert a["boxed_rate"] == 0.0 and b["boxed_rate"] == 0.125 and b["boxed_rate/sub"] == 0.25  # one \boxed{3} of 4
    assert a["num_problems"] == 2 and a["num_problems/add"] == 1
    assert a["pass@1/add"] == 0.5 and a["pass@1/sub"] == 0.25
    assert a["maj@4/add"] == 1.0 and a["maj@4/sub"] == 0.0 and b["maj@4/sub"] == 0.5
    assert a["greedy/add"] == 1.0 and a["greedy/sub"] == 0.0 and b["greedy/sub"] == 1.0
    comp = ev.complementarity()
    assert math.isnan(comp["complementarity/A->B"]) and comp["complementarity/A->B/all_fail"] == 0
    assert comp["complementarity/B->A"] == 1.0 and comp["complementarity/B->A/solved"] == 1


def test_no_skills_no_breakdown_and_greedy_off():
    ev = Evaluator(EvalConfig(k=4, greedy=False), integer_match, ScriptedEngine())
    ev.start(0)
    ev.add(fake_policy("A"), [Problem(1, "2+3=", "5")])
    out = ev.finish()["A"]
    assert set(out) == {"pass@1", "pass@4", "maj@4", "boxed_rate", "num_problems"}
    assert ev.complementarity() == {}


@pytest.fixture(scope="module")
def tiny():
    task = ArithmeticTask(**TASK)
    policies = [build_policy(spec("gpt2", "tiny:gpt2-bpe"), task=task),
                build_policy(spec("llama", "tiny:llama-char"), task=task)]
    return task, policies


def test_end_to_end_tiny_policies(tiny):
    task, policies = tiny
    problems = task.heldout_problems()[:3] + task.heldout_problems()[-3:]
    ev = Evaluator(EvalConfig(k=3), integer_match, HFRolloutEngine())

    def run():
        torch.manual_seed(7)
        random.seed(7)
        ev.start(1234)
        for start in (0, 4):
            for p in policies:
                ev.add(p, problems[start : start + 4])
        return ev.finish(), ev.complementarity(), torch.rand(1).item(), random.random()

    first, second = run(), run()
    torch.manual_seed(7)
    random.seed(7)
    untouched = (torch.rand(1).item(), random.random())
    assert first[2:] == untouched  # the training RNG state is restored
    assert first[0] == second[0]  # seeded: deterministic
    assert first[1] == pytest.approx(second[1], nan_ok=True)
    results, comp = first[:2]
    skills = {p.skill for p in problems}
    for name in ("gpt2", "llama"):
        m = results[name]
        assert m["num_problems"] == 6
        for key in ("pass@1", "pass@3", "maj@3", "greedy"):
            assert 0.0 <= m[key] <= 1.0 and all(f"{key}/{s}" in m for s in skills)
        assert m["pass@1"] <= m["pass@3"]
    assert {"complementarity/gpt2->llama", "complementarity/llama->gpt2"} <= set(comp)


def test_greedy_equals_hf_generate(tiny):
    task, policies = tiny
    problems = task.heldout_problems()[:5] + task.heldout_problems()[-5:]
    for policy in policies:
        batched = greedy_generate(policy, problems, max_new_tokens=6, batch_size=4)
        assert batched == greedy_generate(policy, problems, max_new_tokens=6)  # deterministic
        for p, text in zip(problems, batched):
            ids = torch.tensor([policy.encode_prompt(policy.render_prompt(p.problem))])
            with torch.no_grad():
                ref = policy.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                            max_new_tokens=6, pad_token_id=policy.tokenizer.pad_token_id,
                                            eos_token_id=policy.tokenizer.eos_token_id)
            assert text == decode_completion(policy.tokenizer, ref[0, ids.shape[1]:])
        assert policy.model.training  # mode restored


def test_evaluate_file(tiny, tmp_path):
    task, policies = tiny
    path = tmp_path / "bench.jsonl"
    rows = [{"problem": p.problem, "answer": p.answer} for p in task.heldout_problems()[:4]]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    single = evaluate_file(policies[0], path, reward="integer_match", k=2, progress=False, batch_size=3)
    assert single["num_problems"] == 4 and "pass@2" in single and "pass@1/other" not in single
    both = evaluate_file(policies, path, reward="integer_match", k=2, progress=False, limit=3)
    assert both["gpt2"]["num_problems"] == 3 and "complementarity/gpt2->llama" in both["complementarity"]
