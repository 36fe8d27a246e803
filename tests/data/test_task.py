import logging
import time

import pytest

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.types import Problem


def test_problem_text_answer_and_id():
    task = ArithmeticTask(operators=["+", "-", "*"], num_train=300, num_heldout=50)
    for p in task.train_problems() + task.heldout_problems():
        op = {"add": "+", "sub": "-", "mul": "*"}[p.skill]
        a, b = (int(x) for x in p.problem[:-1].split(op))
        assert p.problem == f"{a}{op}{b}="
        assert int(p.answer) == {"+": a + b, "-": a - b, "*": a * b}[op]
        assert 10 <= a <= 99 and 10 <= b <= 99
        assert p.prompt_id == {"+": 1, "-": 2, "*": 3}[op] * 10**8 + a * 10**4 + b
    assert task._problem("+", 2 * 90 + 24) == Problem(100120034, "12+34=", "46", "add")  # operands 10..99


def test_sizes_per_skill_and_disjoint():
    task = ArithmeticTask(num_train=2001, num_heldout=400)
    train, held = task.train_problems(), task.heldout_problems()
    assert len(train) == 2001 and len(held) == 800
    assert sum(p.skill == "add" for p in train) == 1001 and sum(p.skill == "sub" for p in train) == 1000
    assert len(task.problems("heldout", ["add"])) == len(task.problems("heldout", ["sub"])) == 400
    texts_train = {p.problem for p in train}
    texts_held = {p.problem for p in held}
    assert len(texts_train) == 2001 and len(texts_held) == 800
    assert not texts_train & texts_held
    ids = [p.prompt_id for p in train + held]
    assert len(set(ids)) == len(ids)
    assert all(int(p.answer) >= 0 for p in train + held if p.skill == "sub")  # a >= b


def test_deterministic_and_heldout_independent_of_num_train():
    a = ArithmeticTask(num_train=500, seed=3)
    b = ArithmeticTask(num_train=500, seed=3)
    assert a.train_problems() == b.train_problems() and a.heldout_problems() == b.heldout_problems()
    assert ArithmeticTask(num_train=100, seed=3).heldout_problems() == a.heldout_problems()
    assert ArithmeticTask(num_train=500, seed=4).heldout_problems() != a.heldout_problems()


def test_default_caps_train_with_note(caplog):
    with caplog.at_level(logging.INFO, logger="mutual_rl.data.task"):
        task = ArithmeticTask()
        train = task.train_problems()
    # 2-digit: "+" has 90*90 = 8100 pairs, "-" (a >= b) has 90*91/2 = 4095; 400 each are held out.
    assert sum(p.skill == "add" for p in train) == 8100 - 400
    assert sum(p.skill == "sub" for p in train) == 4095 - 400
    assert "capped" in caplog.text
    assert len({p.problem for p in train}) == len(train)


def test_one_digit_space_and_errors():
    task = ArithmeticTask(operators=["+"], digits=1, num_train=1000, num_heldout=20)
    train, held = task.train_problems(), task.heldout_problems()
    assert len(train) == 100 - 20 and len(held) == 20  # 0..9 x 0..9
    assert {p.problem for p in train} | {p.problem for p in held} == {
        f"{a}+{b}=" for a in range(10) for b in range(10)
    }
    with pytest.raises(ValueError, match="only 100 distinct problems"):
        ArithmeticTask(operators=["+"], digits=1, num_heldout=100)
    with pytest.raises(ValueError, match="unsupported"):
        ArithmeticTask(operators=["/"])
    with pytest.raises(ValueError, match="digits"):
        ArithmeticTask(digits=5)
    with pytest.raises(ValueError, match="digits"):
        ArithmeticTask(digits=[])
    with pytest.raises(ValueError, match="answer_format"):
        ArithmeticTask(answer_format="latex")
    with pytest.raises(ValueError, match="duplicates"):
        ArithmeticTask(operators=["+", "+"])
    with pytest.raises(ValueError, match="unknown skills"):
        task.problems("train", ["sub"])
    with pytest.raises(ValueError, match="split"):
        task.problems("test")


def test_mixed_digits_and_negative():
    task = ArithmeticTask(operators=["-"], digits=[1, 2], allow_negative=True, num_train=3000, num_heldout=10)
    assert task.space_size("-") == 100 * 100
    probs = task.train_problems()
    assert any(int(p.answer) < 0 for p in probs)
    tri = ArithmeticTask(operators=["-"], digits=1, num_train=10**6, num_heldout=0)
    pairs = {tuple(int(x) for x in p.problem[:-1].split("-")) for p in tri.train_problems()}
    assert pairs == {(a, b) for a in range(10) for b in range(10) if a >= b}  # triangular index covers all


def test_target_text_and_default_reward():
    p = Problem(1, "12+34=", "46", "add")
    assert ArithmeticTask().target_text(p) == "46"
    boxed = ArithmeticTask(answer_format="boxed")
    assert boxed.target_text(p) == "\\boxed{46}"
    assert (ArithmeticTask().default_reward, boxed.default_reward) == ("integer_match", "boxed_integer_match")
    assert ArithmeticTask(operators=["*", "+"]).skills == ["mul", "add"]


def test_fast():
    t0 = time.perf_counter()
    assert len(ArithmeticTask(operators=["+", "-", "*"], digits=3, num_train=20000).train_problems()) == 20000
    assert time.perf_counter() - t0 < 1.0
