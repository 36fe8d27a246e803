"""GRAFT's gate at several δ at once (regimes/graft_gate.py): hand-derived shares and quantiles."""

from __future__ import annotations

import pytest
import torch

from mutual_rl.regimes.graft_gate import GATE_DELTAS, admit_tag, gate_grid, quantile_tag


def test_shares_are_strict_and_split_by_outcome():
    s = torch.tensor([0.2, 0.5, 0.75, 0.8, 0.95, 0.1, 0.6], dtype=torch.float64)  # as GRAFT computes s
    ok = torch.tensor([True, True, True, True, True, False, False])
    g = gate_grid(s, ok)
    # successes 0.2, 0.5, 0.75, 0.8, 0.95: > 0.3: 4; > 0.5: 3 (0.5 is not admitted); > 0.7: 3; > 0.8: 1; > 0.9: 1
    assert [g[admit_tag("success", d)] for d in GATE_DELTAS] == [0.8, 0.6, 0.6, 0.2, 0.2]
    # failures 0.1, 0.6
    assert [g[admit_tag("failure", d)] for d in GATE_DELTAS] == [0.5, 0.5, 0.0, 0.0, 0.0]
    assert g[quantile_tag("success", 50)] == pytest.approx(0.75)
    assert g[quantile_tag("success", 25)] == pytest.approx(0.5)
    assert g[quantile_tag("success", 90)] == pytest.approx(0.8 + 0.6 * 0.15)  # index 3.6 of 5 sorted values
    assert g[quantile_tag("failure", 10)] == pytest.approx(0.1 + 0.1 * 0.5)
    assert admit_tag("success", 0.8) == "gate/admit_success@0.8"


def test_a_kind_with_no_response_is_absent():
    g = gate_grid(torch.tensor([0.9, 0.4]), torch.tensor([True, True]))
    assert not any("failure" in k for k in g)
    assert g[admit_tag("success", 0.5)] == 0.5
    assert gate_grid(torch.zeros(0), torch.zeros(0, dtype=torch.bool)) == {}
    with pytest.raises(ValueError, match="2 scores but 1 outcomes"):
        gate_grid(torch.tensor([0.9, 0.4]), torch.tensor([True]))
