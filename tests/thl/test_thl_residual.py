"""Residual report (mutual_rl.thl.residual) against hand-derived values."""

import pytest
import torch

from mutual_rl.thl import AlignmentGroup, align_trace, alignment_groups, residual_report

GROUPS = [AlignmentGroup((0, 1), (0,)), AlignmentGroup((2,), (1, 2)), AlignmentGroup((3,), (3,))]


def test_hand_derived_values():
    aligned = torch.tensor([-1.0, -2.0, -3.0, -4.0])
    receiver = torch.tensor([-1.5, -2.0, -1.0, -4.0])
    # |r| = [0.5, 0, 2, 0]; sorted [0, 0, 0.5, 2]; p90 at 0.9 * 3 = 2.7: 0.5 + 0.7 * 1.5 = 1.55
    out = residual_report(aligned, receiver, GROUPS)
    assert out == pytest.approx({"residual_mean": 0.625, "residual_max": 2.0, "residual_p90": 1.55,
                                 "num_tokens": 4.0, "num_groups": 3.0, "group_count_mismatch": 2 / 3}, abs=1e-12)
    assert all(isinstance(v, float) for v in out.values())


def test_batch_is_concatenation():
    a, r = [torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -4.0])], [torch.tensor([-1.5, -2.0]),
                                                                        torch.tensor([-1.0, -4.0])]
    groups = [[AlignmentGroup((0, 1), (0,))], [AlignmentGroup((2,), (1, 2)), AlignmentGroup((3,), (3,))]]
    assert residual_report(a, r, groups) == residual_report(torch.cat(a), torch.cat(r), GROUPS)


def test_identical_tokenizers_have_zero_residual():
    text, off, logp = "x = 12", [(0, 1), (1, 3), (3, 5), (5, 6)], torch.tensor([-0.1, -0.2, -0.3, -0.4])
    out = residual_report(align_trace(text, off, logp, off, "span"), logp, alignment_groups(text, off, off, "span"))
    assert out["residual_max"] == 0.0 and out["group_count_mismatch"] == 0.0 and out["num_groups"] == 4.0


def test_empty_and_shape_errors():
    assert residual_report(torch.zeros(0), torch.zeros(0), []) == {
        "residual_mean": 0.0, "residual_max": 0.0, "residual_p90": 0.0, "num_tokens": 0.0, "num_groups": 0.0,
        "group_count_mismatch": 0.0}
    assert "group_count_mismatch" not in residual_report(torch.zeros(1), torch.zeros(1))
    with pytest.raises(ValueError, match="differ"):
        residual_report(torch.zeros(2), torch.zeros(3))
