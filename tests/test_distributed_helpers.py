"""The multi-process helpers without a process group (one process): identities, and the rank split."""

from __future__ import annotations

import pytest

from mutual_rl import distributed as D


def test_one_process_helpers_are_identities():
    assert D.rank_and_world() == (0, 1) and not D.is_distributed()
    assert D.agree_max([3, 0, 2]) == [3, 0, 2] and D.agree_sum([1.5, 2]) == [1.5, 2.0]
    assert D.mean_over_ranks({"a": 1, "b": 2.5}) == {"a": 1.0, "b": 2.5}
    assert D.gather_objects({"x": 1}) == [{"x": 1}]
    assert str(D.collective_device()) == "cpu" and not D.lockstep_needed(None)


@pytest.mark.parametrize("n, world", [(10, 3), (2, 4), (0, 2), (7, 1)])
def test_rank_part_splits_in_order_without_overlap(n, world):
    items = list(range(n))
    parts = [D.rank_part(items, r, world) for r in range(world)]
    assert sum(parts, []) == items
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
