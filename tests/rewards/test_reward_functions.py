"""TRL-style rewards f(prompts, completions, **columns), weighted lists of terms, and both inside a short run."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import pytest
import torch

from mutual_rl.evaluation import EvalConfig, Evaluator
from mutual_rl.model.spec import PolicySpec, SamplingSpec, WarmStart
from mutual_rl.rewards import (
    GuardedBatchReward,
    Reward,
    RewardError,
    RewardTerm,
    as_reward,
    build_reward,
    integer_match,
    register_reward,
    reward_style,
)
from mutual_rl.rewards.base import available_rewards
from mutual_rl.stats import flatten
from mutual_rl.types import Problem, Rollout
from mutual_rl.update.scoring import score_groups
from tests.module.helpers import RecordMetrics

CALLS: list[dict] = []  # what the registered TRL-style rewards below were called with


def trl_len(prompts, completions, **kwargs):
    CALLS.append({"prompts": prompts, "completions": completions, **kwargs})
    return [len(c) / 10 for c in completions]


def trl_level_hit(prompts, completions, level, answer):
    """Only the keywords it names: 1 where the completion contains str(level), None where it is empty."""
    return [None if not c else float(str(lv) in c) for c, lv in zip(completions, level)]


def only_completions(completions, **kwargs):
    return [1.0] * len(completions)


def sleeps(prompts, completions, **kwargs):
    time.sleep(60)


def raises(prompts, completions, **kwargs):
    raise KeyError("level")


def too_short(prompts, completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def with_nan(prompts, completions, **kwargs):
    return [1.0] + [math.nan] * (len(completions) - 1)


def scalar(prompts, completions, **kwargs):
    return 1.0


def _register(name, fn):
    if name not in available_rewards():
        register_reward(name)(fn)


_register("trl_len", trl_len)
_register("trl_level_hit", trl_level_hit)

PROBLEM = Problem(7, "12+34=", "46", "add", {"level": 3, "source": "synthetic", "tags": ["a", "b"]})


def _rollout(problem: Problem, group_id: int, text: str) -> Rollout:
    ids = torch.ones(max(len(text), 1), dtype=torch.long)
    return Rollout("p", problem.prompt_id, group_id, 0, 0, problem.problem, text, torch.ones(2, dtype=torch.long),
                   ids, torch.zeros(len(ids)), tuple((0, 0) for _ in ids), "eos")


def test_style_is_detected_from_the_signature():
    assert reward_style(integer_match) == "text"
    assert reward_style(lambda completion, answer: 1.0) == "text"
    assert reward_style(trl_len) == "trl" and reward_style(only_completions) == "trl"
    assert reward_style(trl_level_hit) == "trl"
    assert reward_style(len) == "text"  # no signature: the classic style


def test_columns_reach_the_reward_as_aligned_lists():
    CALLS.clear()
    guard = GuardedBatchReward(trl_len)
    values, status = guard.score_group(PROBLEM, ["46", "4", ""])
    assert status == "ok" and values == [0.2, 0.1, 0.0]
    assert CALLS == [{"prompts": ["12+34="] * 3, "completions": ["46", "4", ""], "answer": ["46"] * 3,
                      "level": [3, 3, 3], "source": ["synthetic"] * 3, "tags": [["a", "b"]] * 3}]


def test_a_function_without_kwargs_gets_only_what_it_names():
    values, _ = GuardedBatchReward(trl_level_hit).score_group(PROBLEM, ["x3", "", "7"])
    assert values == [1.0, None, 0.0]
    bare = Problem(8, "1+1=", "2")  # no columns: 'level' is missing, a configuration error even in skip mode
    with pytest.raises(RewardError, match=r"reward 'trl_level_hit' \(TRL-style\) needs the keyword\(s\) \['level'\]"
                                          r".*it gets \['answer', 'completions', 'prompts'\]"):
        GuardedBatchReward(trl_level_hit, errors="skip").score_group(bare, ["2"])


def test_a_column_named_like_a_keyword_is_an_error():
    clash = Problem(9, "q", "1", columns={"completions": "x"})
    with pytest.raises(RewardError, match=r"column\(s\) \['completions'\].*rename those columns"):
        GuardedBatchReward(only_completions).score_group(clash, ["a"])


@pytest.mark.parametrize(("fn", "what"), [
    (too_short, r"returned 2 values for 3 completions"),
    (with_nan, r"returned nan \(float\) for completion 1 \('4'\), not a finite number or None"),
    (scalar, r"returned 1.0 \(float\), not a list with one value per completion"),
    (raises, r"raised KeyError: 'level'"),
])
def test_bad_results_raise_one_error_naming_the_function(fn, what):
    with pytest.raises(RewardError, match=rf"^reward 'my.rewards:{fn.__name__}' {what} \(policy 'a', prompt 7\) on "
                                          r"the 3 completions of prompt '12\+34=' with answer '46'; fix the reward"):
        GuardedBatchReward(fn, f"my.rewards:{fn.__name__}").score_group(PROBLEM, ["46", "4", "x"],
                                                                         where="policy 'a', prompt 7")
    skip = GuardedBatchReward(fn, errors="skip")
    assert skip.score_group(PROBLEM, ["46", "4", "x"]) == ([0.0, 0.0, 0.0], "error")
    assert (skip.counts.errors, skip.counts.timeouts) == (3, 0)  # each completion of the call


def test_timeouts_scale_with_the_group_in_both_modes():
    t0 = time.perf_counter()
    with pytest.raises(RewardError, match=r"reward 'sleeps' did not return within 0.2 s \(2 completions x 0.1 s\)"
                                          r".*raise model.reward_timeout_s \(now 0.1 s per completion\)"):
        GuardedBatchReward(sleeps, timeout_s=0.1).score_group(PROBLEM, ["a", "b"])
    assert time.perf_counter() - t0 < 2
    skip = GuardedBatchReward(sleeps, timeout_s=0.1, errors="skip")
    assert skip.score_group(PROBLEM, ["a", "b"]) == ([0.0, 0.0], "timeout")
    assert (skip.counts.errors, skip.counts.timeouts) == (0, 2)


def test_weighted_sum_and_per_term_metrics_by_hand():
    reward = build_reward([{"fn": "integer_match", "weight": 1.0}, RewardTerm("trl_level_hit", weight=-0.5),
                           RewardTerm("boxed_format", weight=0.2, name="format")])
    assert reward.names == ["integer_match", "trl_level_hit", "format"] and reward.__name__ == "integer_match"
    p2 = Problem(8, "1+2=", "3", columns={"level": 1})
    texts = {7: ["46", "\\boxed{46} 3", ""], 8: ["1", "\\boxed{3}", "3"]}
    per_prompt = [[_rollout(p, g, t) for t in texts[p.prompt_id]] for g, p in enumerate([PROBLEM, p2])]
    groups, m = score_groups("p", [PROBLEM, p2], per_prompt, reward)
    # integer_match: [1, 1, 0], [0, 1, 1]; level hit: [0, 1, None], [1, 0, 0]; boxed_format: [0, 1, 0], [0, 1, 0]
    assert groups[0].rewards.tolist() == pytest.approx([1.0, 1.0 - 0.5 + 0.2, 0.0])
    assert groups[1].rewards.tolist() == pytest.approx([-0.5, 1.0 + 0.2, 1.0])
    assert m.reward_terms["integer_match"] == pytest.approx(4 / 6)
    assert m.reward_terms["trl_level_hit"] == pytest.approx(2 / 6)  # the None counts 0.0
    assert m.reward_terms["format"] == pytest.approx(2 / 6)
    assert m.reward == pytest.approx((1 + 0.7 + 0 - 0.5 + 1.2 + 1) / 6)
    assert (m.reward_errors, m.reward_timeouts) == (0, 0)
    assert flatten(m)["reward/format"] == pytest.approx(2 / 6)  # logged as reward/<term>
    assert reward.correct(PROBLEM, ["46", "x"]) == [True, False]  # the first term decides


def test_a_single_name_logs_no_per_term_metrics_and_keeps_the_guard():
    reward = build_reward("integer_match", timeout_s=2.0, errors="skip")
    assert reward.names == ["integer_match"] and not reward.log_terms
    _, m = score_groups("p", [PROBLEM], [[_rollout(PROBLEM, 0, "46")]], reward)
    assert m.reward_terms == {} and not any(k.startswith("reward/") for k in flatten(m)) and m.reward == 1.0
    assert reward(" 46", "46") == 1.0


def test_skip_mode_counts_completions_over_terms():
    _register("trl_raises", raises)
    reward = build_reward([RewardTerm("integer_match"), RewardTerm("trl_raises", weight=2.0)], errors="skip")
    groups, m = score_groups("p", [PROBLEM], [[_rollout(PROBLEM, 0, t) for t in ["46", "1"]]], reward)
    assert groups[0].rewards.tolist() == [1.0, 0.0] and m.reward_terms["trl_raises"] == 0.0
    assert (m.reward_errors, m.reward_timeouts) == (2, 0) and reward.counts.errors == 2


def test_plain_trl_function_is_guarded_with_the_defaults():
    reward = as_reward(trl_len)
    assert isinstance(reward, Reward) and isinstance(reward.terms[0].scorer, GuardedBatchReward)
    assert reward.terms[0].scorer.timeout_s == 5.0
    with pytest.raises(TypeError, match="has TRL-style terms.*call score_group"):
        reward("46", "46")


@pytest.mark.parametrize(("spec", "message"), [
    ([], r"model.reward is an empty list"),
    ([{"fn": "integer_match"}, {"fn": "integer_match"}], r"several terms are named \['integer_match'\]"),
    ([{"fn": "integer_match"}, {"fn": "nope"}], r"model.reward\[1\]: unknown reward 'nope'; choose one of"),
    ([{"fn": "integer_match", "wieght": 2}], r"model.reward\[0\].*unknown: \['wieght'\]"),
    ([{"fn": "integer_match", "weight": math.inf}], r"RewardTerm.weight of 'integer_match' must be a finite number"),
    ([{"fn": "integer_match", "style": "json"}], r"RewardTerm.style of 'integer_match' must be one of auto, text"),
    ("[{fn: integer_match, weight: x}]", r"looks like a list of terms but is not one: each term is \{fn: "),
])
def test_bad_reward_lists_say_what_to_fix(spec, message):
    with pytest.raises(ValueError, match=message):
        build_reward(spec)


def test_evaluation_uses_the_first_term_even_when_it_is_trl_style():
    reward = build_reward([RewardTerm("trl_level_hit"), RewardTerm("integer_match", weight=5.0)])

    class Engine:
        def generate(self, policy, problems, sampling, *, step):
            return [[SimpleNamespace(response_text=t) for t in ["3", "46", "x3", ""]] for _ in problems]

    policy = SimpleNamespace(name="A", spec=SimpleNamespace(sampling=SamplingSpec(max_new_tokens=5)),
                             device=torch.device("cpu"))
    ev = Evaluator(EvalConfig(k=4, greedy=False), reward, Engine())
    ev.start(0)
    ev.add(policy, [PROBLEM])
    out = ev.finish()["A"]
    assert out["pass@1"] == pytest.approx(2 / 4)  # "3" and "x3" hold the level; "46" (integer_match) does not count


# ------------------------------------------------------------------------------------------------ end to end
E2E_CALLS: list[dict] = []


def e2e_trl_len(prompts, completions, answer, target, **kwargs):
    E2E_CALLS.append({"prompts": prompts, "answer": answer, "target": target, "n": len(completions)})
    return [float(len(c) >= t) for c, t in zip(completions, target)]


_register("e2e_trl_len", e2e_trl_len)


def test_a_run_with_a_dataset_and_a_weighted_list_logs_each_term(tmp_path):
    datasets = pytest.importorskip("datasets")
    import lightning.pytorch as pl

    from mutual_rl.data.datamodule import PromptDataModule
    from mutual_rl.data.hf_datasets import HFDataset
    from mutual_rl.module import MutualRLModule
    from tests.module.helpers import trainer

    rows = {"q": [f"{a}+{a}=" for a in range(1, 9)], "a": [str(2 * a) for a in range(1, 9)],
            "target": [a % 5 + 1 for a in range(1, 9)]}  # 5: longer than any response
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "ds"))
    src = HFDataset(str(tmp_path / "ds"))
    dm = PromptDataModule(train_dataset=src, val_dataset=src, problem_key="q", answer_key="a", batch_size=4,
                          val_batch_size=8)
    spec = PolicySpec(name="char", model="tiny:llama-char", warmstart=WarmStart(steps=0),
                      sampling=SamplingSpec(n=2, max_new_tokens=4))
    m = MutualRLModule([spec], reward=[RewardTerm("e2e_trl_len", weight=1.0, name="len"),
                                       RewardTerm("test_parity", weight=0.5)],
                       evaluation=EvalConfig(k=2, greedy=False), log_samples_every_n_steps=0)
    pl.seed_everything(0)
    E2E_CALLS.clear()
    rec = RecordMetrics()
    trainer(tmp_path, max_steps=2, callbacks=[rec], limit_val_batches=1).fit(m, datamodule=dm)
    assert len(rec.rows) == 2
    for row in rec.rows:
        assert {"char/reward/len", "char/reward/test_parity"} <= set(row)
        assert row["char/reward"] == pytest.approx(row["char/reward/len"] + 0.5 * row["char/reward/test_parity"],
                                                   abs=1e-6)
        assert 0.0 <= row["char/reward/len"] <= 1.0 and row["char/reward_errors"] == 0.0
    # the epoch's 8 prompts in 2 steps: the step with "4+4=" (target 5 > max_new_tokens) has 2 of 8 responses at 0
    assert min(row["char/reward/len"] for row in rec.rows) <= 0.75
    target = dict(zip(rows["q"], rows["target"]))
    answer = dict(zip(rows["q"], rows["a"]))
    train_calls = [c for c in E2E_CALLS if c["n"] == 2]
    assert len(train_calls) >= 2 * 4  # 2 steps x 4 prompts (and evaluation at the start, k = 2)
    for call in E2E_CALLS:  # every call: one prompt's group, its own row's values
        (prompt,) = set(call["prompts"])
        assert call["target"] == [target[prompt]] * call["n"] and call["answer"] == [answer[prompt]] * call["n"]
