"""The step report's logged names, count names and reduction over ranks, on hand-built reports."""

from __future__ import annotations

import math

from mutual_rl.stats import ObjectiveStats, RolloutStats, ScoringStats, TokenStats, UpdateStats, merge
from mutual_rl.step.report import PolicyStepReport, StepReport


def _report(reward: float, errors: int, tokens: float, flows: float, regime: dict) -> StepReport:
    upd = UpdateStats(trained_tokens=tokens, skipped_frac=0.5, loss=1.0, grad_norm=2.0, lr=1e-4, train_s=2.0,
                      tokens=ObjectiveStats(rows=TokenStats(num_tokens=tokens, entropy=1.5, approx_kl=0.25),
                                            own=TokenStats(num_tokens=4.0, approx_kl=0.5)))
    p = PolicyStepReport("a", RolloutStats(generated_tokens=8.0, gen_s=4.0, response_length=2.0, eos_frac=1.0),
                         ScoringStats(reward=reward, pass_rate=0.5, all_fail_frac=0.0, all_pass_frac=0.0, mixed_frac=1.0,
                                      reward_errors=errors, reward_terms={"fmt": 0.5}),
                         update=upd, regime=regime, thl={"thl/b->a/residual_mean": 0.1})
    return StepReport(3, {"a": p}, exchange={"exchange/b->a/delivered": flows}, replayed_rewards={"c": 0.25})


def test_logged_names_are_the_field_names():
    m = _report(0.5, 1, 6.0, 16.0, {"sgt/rescued": 2.0}).metrics()
    assert m == {
        "exchange/b->a/delivered": 16.0, "a/generated_tokens": 8.0, "a/gen_s": 4.0, "a/response_length": 2.0,
        "a/eos_frac": 1.0, "a/gen_tokens_per_s": 2.0, "a/reward": 0.5, "a/pass_rate": 0.5, "a/all_fail_frac": 0.0,
        "a/all_pass_frac": 0.0, "a/mixed_frac": 1.0, "a/reward_errors": 1.0, "a/reward_timeouts": 0.0,
        "a/reward/fmt": 0.5, "a/trained_tokens": 6.0, "a/skipped_frac": 0.5, "a/loss": 1.0, "a/grad_norm": 2.0,
        "a/entropy": 1.5, "a/approx_kl": 0.25, "a/self/approx_kl": 0.5, "a/lr": 1e-4, "a/train_s": 2.0,
        "a/train_tokens_per_s": 3.0, "a/sgt/rescued": 2.0, "thl/b->a/residual_mean": 0.1, "c/reward": 0.25,
    }
    assert _report(0.5, 1, 6.0, 16.0, {}).count_names() == {
        "exchange/b->a/delivered", "a/reward_errors", "a/reward_timeouts"}


def test_ranks_merge_counts_summed_the_rest_averaged():
    two = merge([_report(0.5, 1, 6.0, 16.0, {"x": 1.0}), _report(0.25, 2, 2.0, 8.0, {"x": 3.0, "y": 5.0})])
    a = two.policies["a"]
    assert two.step == 3 and two.exchange == {"exchange/b->a/delivered": 24.0}  # a count: summed
    assert a.scoring.reward == 0.375 and a.scoring.reward_errors == 3  # mean; count summed
    assert a.update.trained_tokens == 4.0 and a.update.tokens.rows.entropy == 1.5
    assert a.regime == {"x": 2.0, "y": 5.0}  # a key on one rank only: that rank's value, not halved
    assert math.isclose(two.policies["a"].thl["thl/b->a/residual_mean"], 0.1)
    assert merge([_report(0.5, 1, 6.0, 16.0, {})]) is not None and merge([]) is None
