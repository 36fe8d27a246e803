"""The objectives registry stands alone: every built-in objective without importing a regime, and objectives
take tensors and scalars only."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_registry_needs_no_regime_import():
    code = ("import sys; from mutual_rl.update.objectives import get_objective;"
            "fns = [get_objective(n) for n in ('dapo', 'prp_tis', 'hacpo', 'ftis')];"
            "print(sorted(m for m in sys.modules if m.startswith('mutual_rl.regimes')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_objectives_take_scalars_not_a_config():
    from mutual_rl.update.config import GRPOConfig
    from mutual_rl.update.objectives import get_objective

    standard = {"clip_low", "clip_high", "dual_clip", "agg", "kl_coef", "kl_kind", "token_count", "num_seqs",
                "max_len", "ref_logp", "update_index"}
    assert set(GRPOConfig().loss_kwargs()) == {"clip_low", "clip_high", "dual_clip", "agg", "kl_coef", "kl_kind"}
    for name in ("dapo", "prp_tis", "hacpo", "ftis"):
        params = set(inspect.signature(get_objective(name)).parameters)
        assert "cfg" not in params and standard <= params, (name, params)
