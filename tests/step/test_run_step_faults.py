"""A step that raises is abandoned in the exchange (not accounted, not stored), so a script outside Lightning goes
on with the next step; the exchange's step has one owner, so without this the next ``begin_step`` would refuse."""

from __future__ import annotations

import pytest

from mutual_rl.model.policy import build_policy
from mutual_rl.rewards import RewardError
from mutual_rl.step import StepContext, run_step
from tests.module.helpers import datamodule, pair


def test_a_step_that_raises_is_abandoned_and_the_next_one_runs():
    dm = datamodule()
    policies = [build_policy(s, task=dm.task) for s in pair()]
    calls = {"n": 0}

    def reward(completion, answer):  # fails on the first step's first call
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("the grader is down")
        return 1.0 if completion.strip() == answer else 0.0

    ctx = StepContext.from_policies(policies, "sgt", reward=reward)
    batches = iter(dm.train_dataloader())
    with pytest.raises(RewardError, match="the grader is down"):
        run_step(ctx, next(batches), 0)
    assert not ctx.exchange.step_open  # abandoned: nothing of step 0 accounted
    assert ctx.exchange.totals() == {}
    report = run_step(ctx, next(batches), 1)
    assert report.step == 1 and not ctx.exchange.step_open
    assert set(report.policies) == {"gpt2", "llama"}
