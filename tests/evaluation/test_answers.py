"""maj@k answer extraction follows each reward's own rule."""

from __future__ import annotations

from mutual_rl.evaluation.answers import answer_extractor, math_answer, strict_integer_answer
from mutual_rl.rewards import integer_match, math_verify


def test_strict_integer_matches_the_reward():
    for text in ["46", " 046\n", "\\boxed{46}", "so \\boxed{46}", "46 47", "the answer is 46", "\\boxed{46", "", "-0"]:
        got = strict_integer_answer(text)
        assert (got == "46") == (integer_match(text, "46") == 1.0), text
    assert strict_integer_answer("-0") == "0" and strict_integer_answer("4 6") is None


def test_math_answer():
    assert math_answer("so $x = \\frac{1}{2}$ and \\boxed{ \\frac{1}{2} }.") == "\\frac{1}{2}"
    assert math_answer("the value is $\\left(3, 4\\right)$.") == "(3,4)"
    assert math_answer("it is 3.5, or 7/2") == "7/2"
    assert math_answer("no answer") is None
    assert math_answer("\\boxed{{12}}") == "12"


def test_extractor_by_reward():
    assert answer_extractor(integer_match) is strict_integer_answer
    assert answer_extractor(math_verify) is math_answer
    assert answer_extractor("math_verify") is math_answer
    generic = answer_extractor(lambda c, a: 0.0)
    assert generic("x \\boxed{ab}") == "ab" and generic("  ") is None and generic(" ab ") == "ab"


def test_only_enclosing_braces_are_stripped():
    assert math_answer("\\boxed{{1}+{2}}") == "{1}+{2}"
