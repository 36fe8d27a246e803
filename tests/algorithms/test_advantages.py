import math

import pytest
import torch

from mutual_rl.algorithms import group_outcome_stats, group_success_counts, grpo_advantages

EPS = 1e-6
# Groups by id (interleaved, non-contiguous, a negative id):
#   7 -> idx 0,2,10,11 rewards 1,0,0,1   mean 1/2, unbiased var (4 * 1/4)/3 = 1/3
#   3 -> idx 1,3,9     rewards 0,1,1     mean 2/3, unbiased var (4/9+1/9+1/9)/2 = 1/3
#   5 -> idx 4..7      rewards 1,1,1,1   zero variance -> 0
#  -2 -> idx 8         reward 0.5        size 1 -> 0
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 1.0, 0.0, 1.0]
IDS = [7, 3, 7, 3, 5, 5, 5, 5, -2, 3, 7, 7]


def test_hand_example_group_scale():
    s = 1.0 / math.sqrt(3.0) + EPS  # std + eps, same for groups 7 and 3
    a7, a3p, a3n = 0.5 / s, (1 / 3) / s, -(2 / 3) / s  # 0.86602..., 0.57735..., -1.15470...
    expected = [a7, a3n, -a7, a3p, 0, 0, 0, 0, 0, a3p, -a7, a7]
    got = grpo_advantages(torch.tensor(REWARDS, dtype=torch.float64), torch.tensor(IDS))
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)
    assert abs(a7 - 0.8660239) < 1e-6 and abs(a3n + 1.1547) < 1e-4


def test_hand_example_scale_none():
    expected = [0.5, -2 / 3, -0.5, 1 / 3, 0, 0, 0, 0, 0, 1 / 3, -0.5, 0.5]
    got = grpo_advantages(torch.tensor(REWARDS, dtype=torch.float64), torch.tensor(IDS), scale="none")
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)


def test_degenerate_groups_exactly_zero():
    # 0.1 * 3 / 3 != 0.1 in floating point: zero variance must still give exactly 0.
    r = torch.tensor([0.1, 0.1, 0.1, 0.7, 2.0])
    g = torch.tensor([4, 4, 4, 9, 1])
    for scale in ("group", "none"):
        assert torch.equal(grpo_advantages(r, g, scale=scale), torch.zeros(5))


def test_float32_and_int_rewards_dtype():
    a = grpo_advantages(torch.tensor([1.0, 0.0], dtype=torch.float32), torch.tensor([0, 0]))
    assert a.dtype == torch.float32
    b = grpo_advantages(torch.tensor([1, 0]), torch.tensor([0, 0]))
    assert b.dtype == torch.get_default_dtype()
    torch.testing.assert_close(b, torch.tensor([1.0, -1.0]) / (math.sqrt(0.5) + EPS) * 0.5)


def _verl_reference(rewards, ids, eps=EPS):
    """Slow loop of verl's compute_grpo_outcome_advantage (groups of size >= 2)."""
    out = torch.empty_like(rewards)
    for g in ids.unique().tolist():
        sel = ids == g
        scores = rewards[sel]
        out[sel] = (scores - torch.mean(scores)) / (torch.std(scores) + eps)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_matches_verl_reference_loop(seed):
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(2, 9, (7,), generator=gen).tolist()
    labels = torch.randint(-1000, 1000, (7,), generator=gen).unique()[: len(sizes)]
    ids = torch.cat([torch.full((n,), int(lab)) for n, lab in zip(sizes, labels)])
    perm = torch.randperm(ids.numel(), generator=gen)
    ids = ids[perm]
    rewards = torch.rand(ids.numel(), generator=gen, dtype=torch.float64)
    rewards[ids == ids[0]] = (rewards[ids == ids[0]] > 0.5).double()  # a binary group too
    torch.testing.assert_close(
        grpo_advantages(rewards, ids), _verl_reference(rewards, ids), rtol=1e-9, atol=1e-9
    )


def test_errors():
    with pytest.raises(ValueError, match="choices.*group.*none"):
        grpo_advantages(torch.ones(2), torch.zeros(2, dtype=torch.long), scale="std")
    with pytest.raises(ValueError, match="integer"):
        grpo_advantages(torch.ones(2), torch.zeros(2))
    with pytest.raises(ValueError, match=r"\[N\]"):
        grpo_advantages(torch.ones(3), torch.zeros(2, dtype=torch.long))
    assert grpo_advantages(torch.ones(0), torch.zeros(0, dtype=torch.long)).numel() == 0


def test_group_outcome_stats():
    stats = group_outcome_stats(torch.tensor(REWARDS), torch.tensor(IDS), success_threshold=0.0)
    # groups: 7 mixed, 3 mixed, 5 all-pass, -2 all-pass (0.5 > 0)
    assert stats == {
        "num_groups": 4.0,
        "all_fail_frac": 0.0,
        "all_pass_frac": 0.5,
        "mixed_frac": 0.5,
        "pass_rate": 9 / 12,
        "reward_mean": pytest.approx(8.5 / 12),
    }
    stats = group_outcome_stats(torch.tensor(REWARDS), torch.tensor(IDS), success_threshold=0.5)
    assert stats["all_fail_frac"] == 0.25 and stats["all_pass_frac"] == 0.25 and stats["mixed_frac"] == 0.5
    assert stats["pass_rate"] == 8 / 12
    uniq, k, n = group_success_counts(torch.tensor(REWARDS), torch.tensor(IDS))
    assert uniq.tolist() == [-2, 3, 5, 7] and k.tolist() == [1, 2, 4, 2] and n.tolist() == [1, 3, 4, 4]
