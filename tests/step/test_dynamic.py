"""``step/dynamic.py`` alone, with fake engines: the rounds, the cut, the metrics, and the lockstep agreement
of several processes (simulated by replacing the one reduction it makes)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

import mutual_rl.step.dynamic as dyn
from mutual_rl.rewards import RewardError
from mutual_rl.stats import ScoringStats, flatten
from mutual_rl.types import Problem, PromptBatch, ScoredGroup

POOL = [Problem(i, f"{i}+0=", str(i)) for i in range(40)]
DM = SimpleNamespace(train_problems=lambda: POOL, seed=7)


@dataclass
class _R:
    response_ids: list
    finish_reason: str = "eos"


class _Fake:
    """Two rollouts of 3 tokens per prompt; prompt ids in ``mixed`` get rewards [1, 0], others [0, 0]."""

    def __init__(self, mixed=(), fail_on_call=None):
        self.mixed, self.fail_on_call, self.calls = set(mixed), fail_on_call, []

    def generate(self, problems, base):
        self.calls.append(([p.prompt_id for p in problems], base))
        return [[_R([1, 2, 3]), _R([1, 2, 3])] for _ in problems]

    def score(self, problems, per_prompt):
        if self.fail_on_call is not None and len(self.calls) == self.fail_on_call:
            raise RewardError("boom")
        groups = [ScoredGroup("p", p.prompt_id, i, tuple(rs),
                              torch.tensor([1.0, 0.0] if p.prompt_id in self.mixed else [0.0, 0.0]), torch.zeros(2))
                  for i, (p, rs) in enumerate(zip(problems, per_prompt))]
        return groups, ScoringStats(reward=0.5, pass_rate=0.5, all_fail_frac=0.0, all_pass_frac=0.0, mixed_frac=1.0,
                                    reward_errors=1, reward_timeouts=0)


def _run(fake, batch, max_rounds=3, lockstep=False):
    return dyn.dynamic_sample(fake.generate, fake.score, batch, step=2, max_rounds=max_rounds, datamodule=DM,
                              lockstep=lockstep)


def test_rounds_cut_and_metrics():
    batch = PromptBatch(2, POOL[:4], offset=8)
    fake = _Fake(mixed={0} | set(range(4, 40)))
    s = _run(fake, batch)
    groups, m = s.groups, {**flatten(s.rollout), **flatten(s.scoring), **flatten(s.dynamic_sampling, "dynamic_sampling/")}
    extra = dyn.extra_prompts(POOL, 4, seed=7, step=2, round=1, exclude={0, 1, 2, 3})
    assert fake.calls == [([0, 1, 2, 3], 8), ([p.prompt_id for p in extra], dyn.extra_group_id_base(2, 0, 1, 1, 3, 4))]
    assert [g.prompt_id for g in groups] == [0] + [p.prompt_id for p in extra[:3]]
    assert m["dynamic_sampling/surplus_groups"] == 1.0 and m["dynamic_sampling/dropped_groups"] == 3.0
    assert m["generated_tokens"] == 8 * 2 * 3 and m["reward_errors"] == 2.0  # summed over both rounds
    assert m["reward"] == 0.5  # outcome metrics: round 0's
    assert m["gen_tokens_per_s"] == pytest.approx(m["generated_tokens"] / m["gen_s"])


def test_a_reward_error_is_raised_in_one_process():
    with pytest.raises(RewardError):
        _run(_Fake(fail_on_call=2), PromptBatch(0, POOL[:4], offset=0))


def test_lockstep_full_rank_takes_part_while_another_still_samples(monkeypatch):
    agreed = iter([[1, 0], [1, 0], [0, 0]])  # the other rank needs two more rounds
    seen = []

    def fake_max(values):
        seen.append(list(values))
        return next(agreed)

    monkeypatch.setattr(dyn, "agree_max", fake_max)
    fake = _Fake(mixed=set(range(40)))  # this rank is full at once
    s = _run(fake, PromptBatch(0, POOL[:4], offset=0), lockstep=True)
    assert seen == [[0, 0]] * 3
    assert fake.calls == [([0, 1, 2, 3], 0), ([], 0), ([], 0)]  # two empty generates: the engine's dummies
    assert len(s.groups) == 4 and s.dynamic_sampling.rounds == 0


def test_lockstep_error_on_any_rank_ends_the_rounds_everywhere(monkeypatch):
    monkeypatch.setattr(dyn, "agree_max", lambda values: [1, 1])  # another rank failed
    fake = _Fake()
    s = _run(fake, PromptBatch(0, POOL[:4], offset=0), lockstep=True)
    assert len(fake.calls) == 1 and s.dynamic_sampling.limit_hit == 1  # returns; the module stops together
    monkeypatch.setattr(dyn, "agree_max", lambda values: list(values))  # one rank alone
    fake = _Fake(fail_on_call=2)  # this rank fails in its first extra round: the next agreement ends it
    with pytest.raises(RewardError):
        _run(fake, PromptBatch(0, POOL[:4], offset=0), lockstep=True)
    assert len(fake.calls) == 2


def test_the_data_module_must_give_training_problems():
    with pytest.raises(ValueError, match="model.algorithm.dynamic_sampling"):
        dyn.dynamic_sample(_Fake().generate, _Fake().score, PromptBatch(0, POOL[:4]), step=0, max_rounds=1,
                           datamodule=None)


def test_sample_table_pairs_groups_with_their_prompts_by_id():
    from mutual_rl.step_metrics import log_samples

    texts = {}
    logger = SimpleNamespace(experiment=SimpleNamespace(add_text=lambda tag, text, step: texts.update({tag: text})))
    rollouts = (SimpleNamespace(response_text="7", prompt_text="Q: 5+0="),)
    groups = {"p": [ScoredGroup("p", 3, 3, rollouts, torch.tensor([1.0]), torch.zeros(1)),  # the batch's prompt 3
                    ScoredGroup("p", 5, dyn.EXTRA_GROUP_IDS, rollouts, torch.tensor([0.0]), torch.zeros(1))]}
    log_samples(logger, groups, PromptBatch(0, POOL[2:4]), step=0, every=1)
    rows = texts["p/samples"].splitlines()[2:]
    assert rows == ["| `3+0=` | `3` | `'7'` | 1 |", "| `Q: 5+0=` | `` | `'7'` | 0 |"]
