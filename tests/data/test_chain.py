"""ChainTask (benchmark v4): the problem space, worked solutions, splits, ids, lengths and bad input."""

from __future__ import annotations

import itertools
import math
import re

import pytest

from mutual_rl.data.chain import ChainTask, unrank_combination
from mutual_rl.rewards import get_reward


def test_unrank_is_colexicographic_order_of_k_subsets():
    for k in (1, 2, 3, 4):
        combos = sorted(itertools.combinations(range(9), k), key=lambda c: c[::-1])
        assert [tuple(unrank_combination(i, k)) for i in range(len(combos))] == combos


def test_hand_derived_problems_and_solutions():
    t = ChainTask()
    assert t.space_size("+") == t.space_size("-") == math.comb(99, 3) == 156849
    # index 100 is the subset {2, 5, 8} (+1: {3, 6, 9}... checked against the colex order below)
    assert unrank_combination(0, 3) == [0, 1, 2] and unrank_combination(100, 3) == [1, 6, 9]
    add, sub = t._problem("+", 100), t._problem("-", 100)
    # c = [2, 7, 10]: + operands 2, 5, 3 (running 7, 10); - is the same chain backwards: 10 - 3 - 5 = 2
    assert (add.problem, add.answer, add.skill, add.prompt_id) == ("2+5+3=", "10", "add", 510000100)
    assert (sub.problem, sub.answer, sub.skill, sub.prompt_id) == ("10-3-5=", "2", "sub", 560000100)
    assert t.target_text(add) == "2+5=7. 7+3=10. \\boxed{10}"
    assert t.target_text(sub) == "10-3=7. 7-5=2. \\boxed{2}"
    four = ChainTask(terms=4)
    p = four._problem("+", 0)
    assert (p.problem, p.answer, p.prompt_id) == ("1+1+1+1=", "4", 520000000)
    assert four.target_text(p) == "1+1=2. 2+1=3. 3+1=4. \\boxed{4}"


@pytest.mark.parametrize("terms", [2, 3, 4])
def test_every_value_in_range_and_answers_match_the_text(terms):
    t = ChainTask(terms=terms, max_value=30, num_heldout=50, num_train=400)
    reward = get_reward("boxed_integer_match")
    for p in t.heldout_problems() + t.train_problems():
        op = "+" if p.skill == "add" else "-"
        numbers = [int(x) for x in p.problem.rstrip("=").split(op)]
        assert len(numbers) == terms and all(n >= 1 for n in numbers)
        value = numbers[0]
        for n in numbers[1:]:
            value = value + n if op == "+" else value - n
            assert 1 <= value <= 30
        assert str(value) == p.answer
        target = t.target_text(p)
        assert len(re.findall(r"=\d+\.", target)) == terms - 1  # one worked step per operation
        assert float(reward(target, p.answer)) == 1.0
        assert float(reward(target.replace("{" + p.answer + "}", "{" + str(value + 1) + "}"), p.answer)) == 0.0


def test_splits_disjoint_deterministic_and_ids_unique():
    t = ChainTask(num_train=2000, num_heldout=400)
    train, held = t.train_problems(), t.heldout_problems()
    assert len(held) == 800 and len(train) == 2000
    assert {p.skill for p in held[:400]} == {"add"} and {p.skill for p in held[400:]} == {"sub"}
    assert not {p.problem for p in train} & {p.problem for p in held}
    ids = [p.prompt_id for p in train + held]
    assert len(set(ids)) == len(ids) and all(5 * 10**8 <= i < 6 * 10**8 for i in ids)
    again = ChainTask(num_train=2000, num_heldout=400)
    assert [p.problem for p in again.heldout_problems()] == [p.problem for p in held]
    assert [p.problem for p in ChainTask(seed=1).heldout_problems()] != [p.problem for p in held]
    assert t.problems("heldout", ["sub"]) == held[400:]


def test_response_lengths_are_in_the_worked_solution_regime():
    """The v4 premise: correct responses of 20-60 tokens for both tiny tokenizers, the answer a small part."""
    from mutual_rl.presets.tokenizers import build_bpe_tokenizer, build_char_tokenizer

    t = ChainTask(num_heldout=400)
    for tok in (build_char_tokenizer(), build_bpe_tokenizer()):
        lengths = [len(tok(t.target_text(p), add_special_tokens=False)["input_ids"]) + 1
                   for p in t.heldout_problems()]
        assert 20 <= min(lengths) and max(lengths) <= 60
        assert tok.unk_token_id is None or all(
            tok.unk_token_id not in tok(t.target_text(p), add_special_tokens=False)["input_ids"]
            for p in t.heldout_problems()[:50])


@pytest.mark.parametrize("kwargs, match", [
    ({"operators": ["*"]}, "operators"), ({"operators": []}, "operators"), ({"operators": ["+", "+"]}, "operators"),
    ({"terms": 1}, "terms"), ({"terms": 5}, "terms"), ({"max_value": 2}, "max_value"),
    ({"num_heldout": -1}, "num_heldout"), ({"max_value": 5, "terms": 2}, "num_heldout"),
    ({"answer_format": "integer"}, "answer_format"), ({"max_value": 500, "terms": 4}, "id block"),
])
def test_bad_settings_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ChainTask(**kwargs)
