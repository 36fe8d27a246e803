"""``trainer.precision`` without float32 master weights (bf16-true) warns when a fit starts; bf16-mixed does not.
The fact behind it: an RL-sized update of a bfloat16 weight rounds away, of a float32 one it does not."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.module.helpers import datamodule, module, pair, trainer


def test_rl_sized_updates_round_away_in_bfloat16():
    # 0.02 lies in [2^-6, 2^-5): bfloat16's step there is 2^-6 * 2^-7 = 1.2e-4, so a change of 1e-6 rounds back
    w16, w32 = torch.tensor([0.02], dtype=torch.bfloat16), torch.tensor([0.02])
    assert torch.equal(w16 - torch.tensor([1e-6], dtype=torch.bfloat16), w16)
    assert float(w32 - 1e-6) != float(w32)


@pytest.mark.parametrize("precision, warns", [("bf16-true", True), ("bf16-mixed", False)])
def test_fit_warns_on_half_precision_weights(tmp_path, precision, warns):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(tmp_path, max_steps=0, precision=precision).fit(module(pair()), datamodule())
    hits = [w for w in caught if "no float32 master copy" in str(w.message)]
    assert len(hits) == (1 if warns else 0), [str(w.message) for w in caught]
    if warns:
        assert "bf16-mixed" in str(hits[0].message)
