"""Rewards that hang or fail, and prompts that do not fit a policy's context, as a run meets them.

The rewards below are given to the module as ``package.module:function`` names, like a user's own reward.
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from mutual_rl.data.datamodule import PromptDataModule
from mutual_rl.model.spec import PolicySpec, SamplingSpec, WarmStart
from mutual_rl.module import MutualRLModule
from mutual_rl.rewards import RewardError
from mutual_rl.types import Problem, PromptBatch, Rollout
from tests.trainer.helpers import trainer

HERE = "tests.reliability.test_rewards_and_data"


def sleep_forever(completion: str, answer: str) -> float:
    while True:
        time.sleep(60)


def raises(completion: str, answer: str) -> float:
    raise KeyError(answer)


def returns_none(completion: str, answer: str):
    return None


def returns_nan(completion: str, answer: str) -> float:
    return float("nan")


def returns_abc(completion: str, answer: str):
    return "abc"


def _spec(name: str = "char", n: int = 2, max_new_tokens: int = 5) -> PolicySpec:
    return PolicySpec(name=name, model="tiny:llama-char", warmstart=WarmStart(steps=0),
                      sampling=SamplingSpec(n=n, max_new_tokens=max_new_tokens))


class ScriptedEngine:
    """Answers every prompt with the given response texts (so a test chooses what the reward sees)."""

    def __init__(self, texts: list[str]):
        self.texts = texts

    def generate(self, policy, problems, sampling, *, step, group_id_base=0):
        return [[self._rollout(policy, p, text, step, group_id_base + i) for text in self.texts[: sampling.n]]
                for i, p in enumerate(problems)]

    @staticmethod
    def _rollout(policy, problem, text, step, group_id):
        ids = torch.tensor(policy.tokenizer(text, add_special_tokens=False)["input_ids"] or [0], dtype=torch.long)
        return Rollout(policy.name, problem.prompt_id, group_id, step, 0, problem.problem, text,
                       torch.tensor(policy.encode_prompt(problem.problem)), ids, torch.zeros(len(ids)),
                       tuple((0, 0) for _ in ids), "length")


def _module(reward: str, texts: list[str] | None = None, **kw) -> MutualRLModule:
    m = MutualRLModule([_spec()], reward=reward, log_samples_every_n_steps=0, **kw)
    m.configure_model()
    if texts is not None:
        m.engine = ScriptedEngine(texts)
    return m


BATCH = PromptBatch(0, [Problem(11, "12+34=", "46"), Problem(12, "50-8=", "42")])


def test_reward_that_never_returns_is_a_counted_timeout_in_skip_mode(preset_cache):
    m = _module(f"{HERE}:sleep_forever", reward_timeout_s=0.2, reward_errors="skip")
    t0 = time.perf_counter()
    groups, metrics = m._rollout_and_score(m.specs[0], BATCH, step=0)  # the real rollout engine
    assert time.perf_counter() - t0 < 4.0  # 4 calls x 0.2 s, plus sampling
    assert (metrics["reward_timeouts"], metrics["reward_errors"]) == (4.0, 0.0)
    assert metrics["reward"] == 0.0 and all(g.rewards.tolist() == [0.0, 0.0] for g in groups)


def test_reward_that_never_returns_stops_the_run_in_raise_mode(preset_cache):
    m = _module(f"{HERE}:sleep_forever", ["46", "47"], reward_timeout_s=0.2)
    t0 = time.perf_counter()
    with pytest.raises(RewardError) as err:
        m._rollout_and_score(m.specs[0], BATCH, step=0)
    assert time.perf_counter() - t0 < 1.5
    msg = str(err.value)
    assert msg.startswith(f"reward '{HERE}:sleep_forever' did not return within 0.2 s (policy 'char', prompt 11) on "
                          "completion '46' with answer '46'")
    assert "raise model.reward_timeout_s (now 0.2 s)" in msg and "model.reward_errors: skip" in msg


@pytest.mark.parametrize(
    ("fn", "what"),
    [
        ("raises", "raised KeyError: '46'"),
        ("returns_none", "returned None, not a finite number"),
        ("returns_nan", "returned nan (float), not a finite number"),
        ("returns_abc", "returned 'abc' (str), not a finite number"),
    ],
)
def test_failing_reward_raises_one_error_naming_reward_completion_and_answer(preset_cache, fn, what):
    long_text = "so \\boxed{46}" + " and more" * 50
    m = _module(f"{HERE}:{fn}", [long_text, "47"])
    with pytest.raises(RewardError) as err:
        m._rollout_and_score(m.specs[0], BATCH, step=0)
    msg = str(err.value)
    assert msg.startswith(f"reward '{HERE}:{fn}' {what} (policy 'char', prompt 11) on completion 'so \\\\boxed{{46}}")
    assert f"... ({len(long_text)} characters) with answer '46'" in msg
    assert "returns a finite float for every completion" in msg and "model.reward_errors: skip" in msg


@pytest.mark.parametrize("fn", ["raises", "returns_none", "returns_nan", "returns_abc"])
def test_failing_reward_is_counted_per_policy_in_skip_mode(preset_cache, fn):
    m = _module(f"{HERE}:{fn}", ["46", "47"], reward_errors="skip")
    groups, metrics = m._rollout_and_score(m.specs[0], BATCH, step=0)
    assert (metrics["reward_errors"], metrics["reward_timeouts"]) == (4.0, 0.0)
    assert [g.rewards.tolist() for g in groups] == [[0.0, 0.0], [0.0, 0.0]]


def test_working_reward_reports_zero_counts(preset_cache):
    m = _module("integer_match", ["46", "42"])
    groups, metrics = m._rollout_and_score(m.specs[0], BATCH, step=0)
    assert [g.rewards.tolist() for g in groups] == [[1.0, 0.0], [0.0, 1.0]]
    assert (metrics["reward_errors"], metrics["reward_timeouts"]) == (0.0, 0.0)


def test_math_verify_timeouts_are_counted_per_policy(preset_cache):
    pytest.importorskip("math_verify")
    from mutual_rl.rewards.verify import verifier_for

    m = _module("math_verify", ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{46}"], reward_timeout_s=0.5)
    try:
        groups, metrics = m._rollout_and_score(m.specs[0], PromptBatch(0, BATCH.problems[:1]), step=0)
    finally:
        verifier_for(0.5).close()
    assert (metrics["reward_timeouts"], metrics["reward_errors"]) == (1.0, 0.0)  # counted, not raised
    assert groups[0].rewards.tolist() == [0.0, 1.0]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"reward_errors": "ignore"}, r"model.reward_errors must be one of raise, skip \(got 'ignore'\)"),
        ({"reward_timeout_s": -1}, r"model.reward_timeout_s must be a finite number of seconds > 0 \(got -1\)"),
        ({"prompt_overflow": "cut"}, r"model.prompt_overflow must be one of error, truncate \(got 'cut'\)"),
    ],
)
def test_settings_are_checked_when_the_module_is_built(kw, message):
    with pytest.raises(ValueError, match=message):
        MutualRLModule([_spec()], **kw)


def _prompt_file(tmp_path, problems: list[str]):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps({"problem": p, "answer": "1"}) for p in problems) + "\n")
    return path


LONG = "1" * 300 + "+1="


def test_prompt_longer_than_the_context_fails_at_set_up(tmp_path, preset_cache):
    dm = PromptDataModule(train_files=[str(_prompt_file(tmp_path, ["1+1=", LONG, "2+3=", "4+4="]))], batch_size=2)
    m = MutualRLModule([_spec()], reward="test_parity", log_samples_every_n_steps=0)
    with pytest.raises(ValueError) as err:
        trainer(tmp_path, max_steps=1).fit(m, datamodule=dm)
    msg = str(err.value)
    assert "policy 'char' (tiny:llama-char): 1 of 4 prompts do not fit its context length 256" in msg
    assert f"prompt {10**9 + 1} '1111" in msg  # file rows are numbered from 10**9
    assert "304 prompt tokens + 5 (sampling.max_new_tokens) = 309 > 256" in msg
    assert "model.prompt_overflow: truncate" in msg


def test_truncate_mode_trains_on_the_prompt_tail(tmp_path, preset_cache):
    dm = PromptDataModule(train_files=[str(_prompt_file(tmp_path, ["1+1=", LONG]))], batch_size=2)
    gpt2 = PolicySpec(name="bpe", model="tiny:gpt2-bpe", warmstart=WarmStart(steps=0),
                      sampling=SamplingSpec(n=2, max_new_tokens=5))  # learned positions: 256 is a hard limit
    m = MutualRLModule([_spec(), gpt2], reward="test_parity", log_samples_every_n_steps=0,
                       prompt_overflow="truncate", eval_at_start=False)
    fit = trainer(tmp_path, max_steps=1)
    fit.fit(m, datamodule=dm)  # the batch holds the long prompt
    assert fit.global_step == 1
    assert m.prompts_truncated == {"char": 1, "bpe": 1}
    for policy in m.policies.values():
        assert len(policy.encode_prompt(policy.render_prompt(LONG))) == 256 - 5
