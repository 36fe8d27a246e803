import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
import time

import pytest

from mutual_rl.data import word_problems
from mutual_rl.data.word_problems import FAMILIES, WordProblemTask, decode_id
from mutual_rl.rewards import boxed_integer_match, integer_match
from mutual_rl.types import Problem

# Independent answers from the numbers in text order (the module docstring's table).
ANSWER = {
    "shopping": lambda n1, p1, n2, p2, m: m - (n1 * p1 + n2 * p2),
    "sharing": lambda a, b, d, c: (a * b + d) / c,
    "travel": lambda v, t1, w, t2, trip: trip - (v * t1 + w * t2),
    "work": lambda r, h, d, k: r * h * d / k,
    "ages": lambda x, y, z, w: z * (x + y) + w,
    "discount": lambda p, n, q, s: n * p - n * p * q / 100 + s,
}
STEP = re.compile(r"(\d+) ([-+*/]) (\d+)(?: ([*/]) (\d+))? = (\d+)")
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b}

FIXED = {  # seed 0, first held-out problem of each family; answers checked by hand
    "shopping": Problem(410022844, "Zara buys 6 markers for $9 each and 9 toy cars for $5 each. She pays with $140. "
                        "How many dollars of change does she get?", "41", "shopping"),
    "sharing": Problem(420000781, "Priya has 2 boxes of 13 plums each and gets 28 more. She shares all the plums "
                       "equally among 6 friends. How many plums does each friend get?", "9", "sharing"),
    "travel": Problem(430004081, "Nora drives at 30 mph for 6 hours, then at 45 mph for 5 hours. The trip is 500 "
                      "miles long. How many miles does she have left to drive?", "95", "travel"),
    "work": Problem(440006860, "Mia's machine makes 29 candles per hour. It runs 3 hours a day for 5 days. She packs "
                    "the candles in boxes of 5. How many boxes does she fill?", "87", "work"),
    "ages": Problem(450002837, "Zara is 5 years old. Mia is 3 years older than Zara. Noah is 2 times as old as Mia. How "
                    "old will Noah be in 18 years?", "34", "ages"),
    "discount": Problem(460006009, "A shop sells shirts for $22 each. Emma buys 10 of them and gets 20% off the total. "
                        "Delivery costs $12. How many dollars does she pay in all?", "188", "discount"),
}
FIXED_TARGETS = {
    "shopping": "6 * 9 = 54. 9 * 5 = 45. 54 + 45 = 99. 140 - 99 = 41. \\boxed{41}",
    "sharing": "2 * 13 = 26. 26 + 28 = 54. 54 / 6 = 9. \\boxed{9}",
    "travel": "30 * 6 = 180. 45 * 5 = 225. 180 + 225 = 405. 500 - 405 = 95. \\boxed{95}",
    "work": "29 * 3 = 87. 87 * 5 = 435. 435 / 5 = 87. \\boxed{87}",
    "ages": "5 + 3 = 8. 2 * 8 = 16. 16 + 18 = 34. \\boxed{34}",
    "discount": "10 * 22 = 220. 220 * 20 / 100 = 44. 220 - 44 = 176. 176 + 12 = 188. \\boxed{188}",
}


@pytest.fixture(scope="module")
def task():
    return WordProblemTask(num_train=6000, num_heldout=100)


def test_fixed_seed_texts_answers_and_targets():
    task = WordProblemTask(num_train=60, num_heldout=3)
    assert task.skills == list(FIXED) == ["shopping", "sharing", "travel", "work", "ages", "discount"]
    for family, expected in FIXED.items():
        got = task.problems("heldout", [family])[0]
        assert got == expected
        assert task.target_text(got) == FIXED_TARGETS[family]
        assert WordProblemTask(answer_format="integer").target_text(got) == expected.answer


def test_every_answer_recomputed_from_the_text(task):
    for p in task.train_problems() + task.heldout_problems():
        nums = [int(x) for x in re.findall(r"\d+", p.problem)]
        assert decode_id(p.prompt_id) == (p.skill, tuple(nums))
        value = ANSWER[p.skill](*nums)
        assert value == int(value) and value >= 1, p  # exact divisions, positive answers
        assert p.answer == str(int(value))
        assert p.problem.isascii() and " 1 hours" not in p.problem and " 1 years" not in p.problem
        assert len(p.problem) <= 150  # fits the tiny presets' 256 positions with a target
        target = task.target_text(p)
        steps, box = target.rsplit(". ", 1)
        assert box == "\\boxed{" + p.answer + "}"
        parts = steps.split(". ")
        assert 3 <= len(parts) <= 4
        for step in parts:
            a, op, b, op2, c, result = STEP.fullmatch(step).groups()
            value = OPS[op](int(a), int(b))
            if op2:
                value = OPS[op2](value, int(c))
            assert value == int(result), step
        assert parts[-1].endswith(f"= {p.answer}")


def test_splits_disjoint_ids_unique_and_in_range():
    task = WordProblemTask()
    train, held = task.train_problems(), task.heldout_problems()
    assert len(train) == 20000 and len(held) == 6 * 400
    counts = {f: sum(p.skill == f for p in train) for f in task.skills}
    assert sorted(counts.values()) == [3333] * 4 + [3334] * 2
    assert [p.skill for p in held] == [f for f in task.skills for _ in range(400)]  # grouped by family
    texts_train, texts_held = {p.problem for p in train}, {p.problem for p in held}
    assert len(texts_train) == len(train) and len(texts_held) == len(held) and not texts_train & texts_held
    numbers = lambda ps: {decode_id(p.prompt_id) for p in ps}  # noqa: E731
    assert not numbers(train) & numbers(held)  # no held-out problem differs from a train one only in its words
    ids = [p.prompt_id for p in train + held]
    assert len(set(ids)) == len(ids)
    assert all(4 * 10**8 <= i < 10**9 for i in ids)
    assert {i // 10**7 - 40 for i in ids} == {f.code for f in FAMILIES.values()}


def test_deterministic_and_heldout_independent_of_num_train():
    a, b = WordProblemTask(num_train=600, seed=3), WordProblemTask(num_train=600, seed=3)
    assert a.train_problems() == b.train_problems() and a.heldout_problems() == b.heldout_problems()
    assert WordProblemTask(num_train=60, seed=3).heldout_problems() == a.heldout_problems()
    other = WordProblemTask(num_train=600, seed=4)
    assert other.heldout_problems() != a.heldout_problems()
    text_of = {p.prompt_id: p.problem for p in a.train_problems() + a.heldout_problems()}
    shared = [p for p in other.train_problems() if p.prompt_id in text_of]
    assert shared and all(text_of[p.prompt_id] == p.problem for p in shared)  # wording depends only on the id
    subset = WordProblemTask(families=["ages", "work"], num_train=100, num_heldout=5)
    assert subset.skills == ["ages", "work"]
    assert subset.problems("heldout", ["work"]) == WordProblemTask(num_heldout=5).problems("heldout", ["work"])
    assert len(subset.problems("train", ["ages"])) == 50


DIGEST = """
import hashlib, json
from mutual_rl.data.word_problems import WordProblemTask
t = WordProblemTask(num_train=3000, num_heldout=50, seed=7)
rows = [(p.prompt_id, p.problem, p.answer, p.skill) for p in t.train_problems() + t.heldout_problems()]
print(hashlib.sha256(json.dumps(rows).encode()).hexdigest())
"""


@pytest.mark.slow
def test_same_problems_under_any_hash_seed(capsys):
    exec(DIGEST, {})
    here = capsys.readouterr().out.strip()
    outs = set()
    for hash_seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", DIGEST], env=env, capture_output=True, text=True, check=True)
        outs.add(out.stdout.strip())
    assert outs == {here} and len(here) == 64


def test_errors_name_the_field(caplog):
    with pytest.raises(ValueError, match=r"families: unknown \['cooking'\]; choose from"):
        WordProblemTask(families=["cooking"])
    with pytest.raises(ValueError, match="duplicates"):
        WordProblemTask(families=["ages", "ages"])
    with pytest.raises(ValueError, match="non-empty list"):
        WordProblemTask(families=[])
    with pytest.raises(ValueError, match="non-empty list"):
        WordProblemTask(families="ages")
    size = WordProblemTask.space_size("work")
    with pytest.raises(ValueError, match=f"'work' has only {size} distinct problems.*lower num_heldout"):
        WordProblemTask(num_heldout=size)
    with pytest.raises(ValueError, match="answer_format"):
        WordProblemTask(answer_format="latex")
    with pytest.raises(ValueError, match="num_train and num_heldout must be >= 0"):
        WordProblemTask(num_train=-1)
    with pytest.raises(ValueError, match="seed must be an integer"):
        WordProblemTask(seed="0")
    task = WordProblemTask(families=["work"], num_train=10, num_heldout=1)
    with pytest.raises(ValueError, match="unknown skills"):
        task.problems("train", ["ages"])
    with pytest.raises(ValueError, match="split"):
        task.problems("test")
    with pytest.raises(ValueError, match="not a word-problem id"):
        decode_id(100120034)
    with pytest.raises(ValueError, match="pass a problem made by this task"):
        task.target_text(Problem(440000000, "x", "999999", "work"))
    with caplog.at_level(logging.INFO, logger="mutual_rl.data.word_problems"):
        capped = WordProblemTask(families=["work"], num_train=10**6, num_heldout=10).train_problems()
    assert len(capped) == size - 10 and "capped" in caplog.text


def test_rewards_score_the_target_and_reject_a_wrong_answer():
    boxed = WordProblemTask(num_train=12, num_heldout=1)
    integer = WordProblemTask(num_train=12, num_heldout=1, answer_format="integer")
    assert (boxed.default_reward, integer.default_reward) == ("math_verify", "integer_match")
    for p in boxed.heldout_problems():
        assert boxed_integer_match(boxed.target_text(p), p.answer) == 1.0
        wrong = boxed.target_text(p).replace("\\boxed{" + p.answer, "\\boxed{" + str(int(p.answer) + 1))
        assert boxed_integer_match(wrong, p.answer) == 0.0
        assert integer_match(integer.target_text(p), p.answer) == 1.0
        assert integer_match(str(int(p.answer) - 1), p.answer) == 0.0


def test_math_verify_scores_the_target_and_rejects_a_wrong_answer():
    pytest.importorskip("math_verify")
    from mutual_rl.rewards import MathVerifier

    task = WordProblemTask(num_train=12, num_heldout=1)
    verifier = MathVerifier(timeout_s=10.0)
    try:
        for p in task.heldout_problems():
            target = task.target_text(p)
            assert verifier(target, p.answer) == 1.0, target
            wrong = target.replace("\\boxed{" + p.answer, "\\boxed{" + str(int(p.answer) + 1))
            assert verifier(wrong, p.answer) == 0.0, wrong
    finally:
        verifier.close()


def test_fast_and_cache_key_fields():
    word_problems._SPACES.clear()  # include building the families' spaces
    t0 = time.perf_counter()
    task = WordProblemTask(num_train=20000, num_heldout=400)
    assert len(task.train_problems()) == 20000 and len(task.heldout_problems()) == 2400
    assert time.perf_counter() - t0 < 1.5
    assert dataclasses.asdict(task) == {"families": list(FAMILIES), "num_train": 20000, "num_heldout": 400,
                                        "seed": 0, "answer_format": "boxed"}
    json.dumps(dataclasses.asdict(task))


def test_feeds_the_datamodule_and_the_warm_start_pool():
    from mutual_rl.data.datamodule import PromptDataModule
    from mutual_rl.model.spec import WarmStart
    from mutual_rl.presets.warmstart import select_problems

    task = WordProblemTask(num_train=120, num_heldout=20)
    dm = PromptDataModule(task=task, batch_size=8, val_per_skill=5)
    assert [p.skill for p in dm.val_problems()] == [f for f in task.skills for _ in range(5)]
    assert len(dm.train_problems()) == 120
    pool = select_problems(task.train_problems(), WarmStart(skills=["ages"], other_skill_fraction=0.0))
    assert len(pool) == 20 and {p.skill for p in pool} == {"ages"}
