import sys

import pytest

from mutual_rl.rewards import (
    RewardResult,
    available_rewards,
    build_reward,
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
    with pytest.raises(ValueError, match="'tests.distributed.cli_reward:__doc__' is a str, not a Python function; "
                                         "give a function of your own: def f\\(completion: str, answer: str\\)"):
        get_reward("tests.distributed.cli_reward:__doc__")


@pytest.mark.parametrize(("spec", "kind"), [
    ("os:system", "is a built-in function, not a Python function"),
    ("builtins:eval", "is a built-in function, not a Python function"),
    ("subprocess:Popen", "is a class, not a Python function"),
    ("shutil:rmtree", "is a function of Python's standard library (shutil), not a reward"),
    ("tests.distributed:cli_reward", "is a module, not a Python function"),
])
def test_import_path_that_is_not_your_own_python_function_is_refused_before_any_call(spec, kind, tmp_path,
                                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as e:
        build_reward(spec)
    assert str(e.value) == (f"reward {spec!r} {kind}; give a function of your own: def f(completion: str, answer: "
                            "str) -> float (or TRL-style f(prompts, completions, **columns) -> list[float | None]).")
    assert list(tmp_path.iterdir()) == []  # nothing ran


def test_module_in_the_working_directory_resolves_as_python_m_would(tmp_path, monkeypatch):
    (tmp_path / "cwd_reward_mod.py").write_text("def half(completion, answer):\n    return 0.5\n")
    (tmp_path / "cwd_reward_pkg").mkdir()
    (tmp_path / "cwd_reward_pkg" / "rew.py").write_text("def one(completion, answer):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    assert get_reward("cwd_reward_mod:half")("x", "y") == 0.5
    assert sys.path[-1] == str(tmp_path)  # appended: an installed module of the same name would win
    assert get_reward("cwd_reward_pkg.rew:one")("x", "y") == 1.0  # a namespace package folder too
    with pytest.raises(ValueError) as e:
        get_reward("cwd_reward_missing:f")
    assert f"package/module.py is a file under the working directory ({tmp_path})" in str(e.value)
