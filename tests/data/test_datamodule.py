"""PromptDataModule: deterministic endless stream, exact resume position, files, held-out caps."""

from __future__ import annotations

import json

import pytest

from mutual_rl.data.datamodule import PromptDataModule
from mutual_rl.data.task import ArithmeticTask

TASK = dict(operators=["+", "-"], digits=2, num_train=100, num_heldout=30)


def test_stream_is_a_deterministic_function_of_seed_and_index():
    a, b = PromptDataModule(ArithmeticTask(**TASK), batch_size=8), PromptDataModule(ArithmeticTask(**TASK), batch_size=8)
    assert [p.prompt_id for p in a.train_batch(3)] == [p.prompt_id for p in b.train_batch(3)]
    c = PromptDataModule(ArithmeticTask(**TASK), batch_size=8, seed=1)
    assert [p.prompt_id for p in a.train_batch(3)] != [p.prompt_id for p in c.train_batch(3)]
    # one epoch visits every training problem exactly once, across batch boundaries
    n = len(a.train_problems())
    seen = [p.prompt_id for i in range(n // 4) for p in PromptDataModule(ArithmeticTask(**TASK), batch_size=4).train_batch(i)]
    assert sorted(seen) == sorted(p.prompt_id for p in a.train_problems())


def test_resume_position():
    dm = PromptDataModule(ArithmeticTask(**TASK), batch_size=8)
    it = iter(dm.train_dataloader())
    first = [next(it) for _ in range(3)]
    assert [b.index for b in first] == [0, 1, 2]
    dm.mark_consumed(1)  # the module trained on batch 1; batch 2 was only prefetched
    state = dm.state_dict()
    dm2 = PromptDataModule(ArithmeticTask(**TASK), batch_size=8)
    dm2.load_state_dict(state)
    resumed = next(iter(dm2.train_dataloader()))
    assert resumed.index == 2
    assert [p.prompt_id for p in resumed.problems] == [p.prompt_id for p in first[2].problems]


def test_val_per_skill_and_batches():
    dm = PromptDataModule(ArithmeticTask(**TASK), val_batch_size=7, val_per_skill=10)
    val = dm.val_problems()
    assert len(val) == 20 and sum(p.skill == "add" for p in val) == 10
    batches = list(dm.val_dataloader())
    assert [len(b.problems) for b in batches] == [7, 7, 6]


def test_files_replace_the_task(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps({"q": f"{i}+1=", "a": i + 1}) for i in range(5)) + "\n")
    dm = PromptDataModule(train_files=[str(path)], val_files=[str(path)], problem_key="q", answer_key="a", batch_size=2)
    assert [p.answer for p in dm.train_problems()] == ["1", "2", "3", "4", "5"]
    assert dm.task is None and len(dm.val_problems()) == 5
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"q": "1+1=", "a": 2}) + "\n" + json.dumps({"q": "2+2="}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl.*2"):
        PromptDataModule(train_files=[str(bad)], problem_key="q", answer_key="a").train_problems()


def test_invalid_batch_size():
    with pytest.raises(ValueError, match="data.batch_size must be >= 1"):
        PromptDataModule(batch_size=0)


def test_ranks_split_each_global_batch():
    """Rank r of W trains on the r-th ``batch_size`` part of global batch i: the parts are disjoint and together are
    the one-process stream with ``batch_size * W``."""
    dm = PromptDataModule(ArithmeticTask(**TASK), batch_size=4)
    whole = PromptDataModule(ArithmeticTask(**TASK), batch_size=8)
    for i in range(30):  # across epoch boundaries (100 problems)
        parts = [[p.prompt_id for p in dm.train_batch(i, rank=r, world_size=2)] for r in range(2)]
        assert parts[0] + parts[1] == [p.prompt_id for p in whole.train_batch(i)]
    assert [p.prompt_id for p in dm.train_batch(5, rank=0, world_size=1)] == [p.prompt_id for p in dm.train_batch(5)]
    with pytest.raises(ValueError, match="rank 2"):
        dm.train_batch(0, rank=2, world_size=2)


def test_batches_carry_their_stream_offset():
    dm = PromptDataModule(ArithmeticTask(**TASK), batch_size=8)
    batches = [b for _, b in zip(range(3), iter(dm.train_dataloader()))]
    assert [b.offset for b in batches] == [0, 8, 16] and dm.rank_and_world() == (0, 1)
    assert "offset=8" in repr(batches[1]) and batches[1] == batches[1] and batches[0] != batches[1]


def test_resume_with_another_global_batch_skips_nothing_twice():
    """A checkpoint from 8 prompts per step resumed with 5: 3 steps = 24 prompts consumed -> batch ceil(24/5) = 5."""
    old = PromptDataModule(ArithmeticTask(**TASK), batch_size=8)
    old.mark_consumed(2)
    state = old.state_dict()
    assert state["prompts_per_batch"] == 8
    new = PromptDataModule(ArithmeticTask(**TASK), batch_size=5)
    new.load_state_dict(state)
    assert new.next_batch == 5
    same = PromptDataModule(ArithmeticTask(**TASK), batch_size=8)
    same.load_state_dict({"next_batch": 3, "seed": 0})  # a checkpoint from before the field existed
    assert same.next_batch == 3
