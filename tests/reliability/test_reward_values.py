"""What a reward returns crosses from its worker process as a plain number: a torch tensor (with or without grad),
a NumPy scalar or 0-d array, an int or a bool become the same float as in the trainer's own process (a tensor used
to fail with ``AuthenticationError: digest sent was rejected``, blamed on the reward); a failed hand-off is the
worker's error, not the reward's; a set, a dict or a generator of the wrong length is refused naming the reward
(a set used to be accepted in arbitrary order)."""

from __future__ import annotations

import pytest

from mutual_rl.rewards import GuardedBatchReward, RewardError, build_reward
from mutual_rl.rewards.isolation import IsolatedReward, RewardWorkerError
from mutual_rl.types import Problem
from tests.reliability import one_glance
from tests.rewards import valued_rewards

MOD = "tests.rewards.valued_rewards"
PROBLEM = Problem(7, "12+34=", "46")
COMPLETIONS = ["4", "46", "x46"]


@pytest.fixture(params=["custom", "none"])
def isolation(request):
    """Both places a reward runs: its worker process (``custom``) and the trainer's process (``none``)."""
    return request.param


@pytest.mark.parametrize(("name", "expected"), [
    ("as_float", 0.25), ("as_int", 3.0), ("as_bool", 1.0), ("numpy_float32", 0.5), ("numpy_0d", 0.75),
    ("tensor", 1.0), ("tensor_float16", 0.125), ("tensor_with_grad", 0.5),
])
def test_every_kind_of_number_is_the_same_float_in_the_worker_and_in_process(name, expected, isolation):
    reward = build_reward(f"{MOD}:{name}", timeout_s=60, isolation=isolation)
    value = reward("46", "46")
    assert type(value) is float and value == expected
    reward.close()


def test_the_worker_hands_back_a_plain_float_not_a_tensor():
    fn = IsolatedReward(valued_rewards.tensor_with_grad, f"{MOD}:tensor_with_grad")
    value = fn.call(("a", "b"), {}, 60)
    assert type(value) is float and value == 0.5
    fn.close()


@pytest.mark.parametrize(("name", "what"), [
    ("tensor_nan", r"returned tensor\(nan\) \(Tensor\), not a finite number"),
    ("tensor_pair", r"returned tensor\(\[1\., 2\.\]\) \(Tensor\), not a finite number"),
])
def test_a_tensor_that_is_no_finite_number_is_one_error_naming_the_reward_and_its_type(name, what, isolation):
    reward = build_reward(f"{MOD}:{name}", timeout_s=60, isolation=isolation)
    with one_glance.raises(RewardError, match=rf"^reward '{MOD}:{name}' {what} on completion '46'"):
        reward("46", "46")
    reward.close()


def _group(name, isolation, errors="raise", problem=PROBLEM):
    reward = build_reward(f"{MOD}:{name}", timeout_s=60, isolation=isolation, errors=errors)
    try:
        return reward.score_group(problem, COMPLETIONS)
    finally:
        reward.close()


@pytest.mark.parametrize("name", ["trl_tensor", "trl_numpy", "trl_generator"])
def test_trl_style_tensors_arrays_and_generators_of_the_right_length_are_per_completion_floats(name, isolation):
    score = _group(name, isolation)
    assert score.total == [1.0, 2.0, 3.0] and all(type(v) is float for v in score.total)


@pytest.mark.parametrize(("name", "what"), [
    ("trl_set", r"returned \{1\.0, 2\.0, 3\.0\} \(set\), an unordered or keyed container: its values cannot be "
                r"matched to the completions \(return a list, in the order of completions\)"),
    ("trl_frozenset", r"returned frozenset\(\{.*\}\) \(frozenset\), an unordered or keyed container"),
    ("trl_dict", r"returned \{'4': 1\.0, .*\} \(dict\), an unordered or keyed container"),
    ("trl_dict_values", r"returned dict_values\(\[1\.0, 2\.0, 3\.0\]\) \(dict_values\), an unordered or keyed"),
    ("trl_short_generator", r"returned a generator that yields 2 values for 3 completions"),
    ("trl_endless_generator", r"returned a generator that yields more than 3 values for 3 completions"),
])
def test_unordered_containers_and_generators_of_the_wrong_length_are_refused_naming_the_reward(name, what, isolation):
    with one_glance.raises(RewardError, match=rf"^reward '{MOD}:{name}' {what}.* on the 3 completions of prompt "
                                          r"'12\+34=' with answer '46'; fix the reward"):
        _group(name, isolation)
    score = _group(name, isolation, errors="skip")  # skip mode: scored 0, counted
    assert score.total == [0.0, 0.0, 0.0] and score.errors == 3


def test_a_failed_hand_off_is_the_workers_error_not_the_rewards_in_both_modes():
    poisoned = Problem(7, "12+34=", "46", columns={"level": valued_rewards.Poisoned()})
    for errors in ("raise", "skip"):
        with one_glance.raises(RewardWorkerError, match=rf"^the worker process of reward {MOD}:trl_level could not "
                                                    r"unpickle the call's arguments \(ValueError: invalid literal "
                                                    r"for int\(\).*not of the reward"):
            _group("trl_level", "custom", errors=errors, problem=poisoned)
    unpicklable = Problem(7, "12+34=", "46", columns={"level": lambda: 1})
    with one_glance.raises(RewardWorkerError, match=rf"^the worker process of reward {MOD}:trl_level could not pickle "
                                                r"the call's arguments for it \(.*\).*not of the reward"):
        _group("trl_level", "custom", problem=unpicklable)
    good = Problem(7, "12+34=", "46", columns={"level": 1})
    assert _group("trl_level", "custom", problem=good).total == [1.0, 2.0, 3.0]  # the worker still answers


def test_in_process_the_same_rules_apply_to_a_guarded_batch_reward():
    values, status = GuardedBatchReward(valued_rewards.trl_generator).score_group(PROBLEM, COMPLETIONS)
    assert (values, status) == ([1.0, 2.0, 3.0], "ok")
    with one_glance.raises(RewardError, match=r"^reward 'trl_set' returned .* \(set\), an unordered or keyed container"):
        GuardedBatchReward(valued_rewards.trl_set).score_group(PROBLEM, COMPLETIONS)
