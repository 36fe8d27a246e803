import pytest

from mutual_rl.rewards import (
    RewardResult,
    available_rewards,
    get_reward,
    integer_match,
    math_verify,
    register_reward,
    score,
)
from mutual_rl.rewards import base as reward_base


def test_builtin_names_resolve():
    assert {"integer_match", "boxed_integer_match", "last_integer", "boxed_format", "math_verify"} <= set(
        available_rewards()
    )
    assert get_reward("integer_match") is integer_match
    assert get_reward("math_verify") is math_verify


def test_unknown_name_lists_choices():
    with pytest.raises(ValueError, match="unknown reward 'nope'.*integer_match"):
        get_reward("nope")


def test_register_and_duplicate(monkeypatch):
    monkeypatch.setattr(reward_base, "_REGISTRY", dict(reward_base._REGISTRY))

    @register_reward("always_half")
    def half(completion: str, answer: str) -> float:
        return 0.5

    assert get_reward("always_half")("x", "y") == 0.5
    with pytest.raises(ValueError, match="already registered"):
        register_reward("always_half")(lambda c, a: 0.0)


def test_score_batch():
    assert score(integer_match, ["46", "47", "\\boxed{3}"], ["46", "46", "3"]) == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        score(integer_match, ["1", "2"], ["1"])


def test_reward_result_is_frozen():
    r = RewardResult(1.0, "ok")
    with pytest.raises(AttributeError):
        r.value = 0.0  # type: ignore[misc]


def test_import_path_names_your_own_function():
    from tests.distributed.cli_reward import parity

    assert get_reward("tests.distributed.cli_reward:parity") is parity
    with pytest.raises(ValueError, match="cannot import 'nope'.*package.module:function"):
        get_reward("tests.distributed.cli_reward:nope")
    with pytest.raises(ValueError, match="cannot import"):
        get_reward("no_such_module_xyz:fn")
    with pytest.raises(ValueError, match="not callable"):
        get_reward("tests.distributed.cli_reward:__doc__")
