import pytest

from mutual_rl.rewards import (
    boxed_format,
    boxed_integer_match,
    integer_match,
    integer_match_with_info,
    last_integer,
)
from mutual_rl.rewards.extract import last_boxed, last_integer_in, parse_integer


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("46", 1.0),
        (" 46\n", 1.0),
        ("046", 1.0),  # leading zeros allowed
        ("\\boxed{46}", 1.0),
        ("so the sum is \\boxed{46}", 1.0),
        ("\\boxed{45} no wait \\boxed{46}", 1.0),  # last box counts
        ("\\boxed{46} no wait \\boxed{45}", 0.0),
        ("\\boxed{ 46 }", 1.0),
        ("47", 0.0),
        ("46 47", 0.0),  # listing numbers is not rewarded
        ("4 6", 0.0),
        ("the answer is 46", 0.0),
        ("46.", 0.0),
        ("+46", 0.0),
        ("\\boxed{46", 0.0),  # unclosed
        ("12+34=46", 0.0),
        ("", 0.0),
        ("٤٦", 0.0),  # Arabic-Indic digits are not ASCII integers
    ],
)
def test_integer_match(completion, expected):
    assert integer_match(completion, "46") == expected


def test_integer_match_negative_and_zero():
    assert integer_match("-7", "-7") == 1.0
    assert integer_match("7", "-7") == 0.0
    assert integer_match("-0", "0") == 1.0
    assert integer_match("\\boxed{-12}", " -12 ") == 1.0


def test_integer_match_info():
    assert integer_match_with_info("x", "3").info == "no answer found"
    assert integer_match_with_info("\\boxed{3", "3").info == "unclosed \\boxed{"
    r = integer_match_with_info("3", "3")
    assert (r.value, r.info) == (1.0, "")


def test_non_integer_gold_raises():
    with pytest.raises(ValueError, match="not an integer"):
        integer_match("1", "0.5")
    with pytest.raises(ValueError, match="not an integer"):
        last_integer("1", "")


def test_boxed_integer_match_requires_box():
    assert boxed_integer_match("46", "46") == 0.0
    assert boxed_integer_match("\\boxed{46}", "46") == 1.0
    assert boxed_integer_match("\\boxed{47}", "46") == 0.0


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("12+34=46", 1.0),
        ("45 46", 1.0),
        ("46 45", 0.0),
        ("\\boxed{46}", 1.0),
        ("no digits", 0.0),
        ("3-46", 0.0),
    ],
)
def test_last_integer(completion, expected):
    assert last_integer(completion, "46") == expected


def test_last_integer_minus_binds_to_last_number():
    assert last_integer_in("3-5") == -5
    assert last_integer_in("a 12 b 7c") == 7
    assert last_integer_in("none") is None


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("\\boxed{46}", 1.0),
        ("text \\boxed{\\frac{1}{2}} end", 1.0),
        ("46", 0.0),
        ("\\boxed{1}\\boxed{2}", 0.0),
        ("\\boxed{1", 0.0),
        ("\\boxed{}", 1.0),  # format only; content is not checked
    ],
)
def test_boxed_format(completion, expected):
    assert boxed_format(completion, "ignored") == expected


def test_last_boxed_nested_and_parse_integer():
    assert last_boxed("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{1} \\boxed{{2}}") == "{2}"
    assert last_boxed("\\boxed{1} \\boxed{2") is None
    assert last_boxed("none") is None
    assert parse_integer(" -03 ") == -3
    assert parse_integer("1e3") is None
    assert parse_integer("1,000") is None
