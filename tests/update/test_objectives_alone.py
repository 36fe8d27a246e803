"""The objectives stand alone: every built-in objective without importing a regime, and objectives hold scalars
only (never a config object)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_objectives_need_no_regime_import():
    code = ("import sys; from mutual_rl.update.objectives import DAPO, FTISObjective, HACPOObjective, "
            "PRPTruncatedIS;"
            "print(sorted(m for m in sys.modules if m.startswith('mutual_rl.regimes')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_objectives_hold_scalars_not_a_config():
    from mutual_rl.update.config import GRPOConfig
    from mutual_rl.update.objectives import DAPO, FTISObjective, HACPOObjective, PRPTruncatedIS

    base = {"clip_low", "clip_high", "dual_clip", "agg", "kl_coef", "kl_kind"}
    assert {f.name for f in dataclasses.fields(GRPOConfig().dapo())} == base
    fields = {cls: {f.name: f.type for f in dataclasses.fields(cls)}
              for cls in (DAPO, PRPTruncatedIS, HACPOObjective, FTISObjective)}
    for cls, types in fields.items():
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
        assert all("Config" not in t and "dict" not in t for t in types.values()), (cls, types)
    # a regime's objective that reuses DAPO's terms takes them as one DAPO; HACPO takes the algorithm's KL only
    assert fields[PRPTruncatedIS] == fields[FTISObjective] == {"is_cap": "float", "dapo": "DAPO | None"}
    assert {"kl_coef", "kl_kind"} <= set(fields[HACPOObjective]) and not (base - {"kl_coef", "kl_kind"}) & set(
        fields[HACPOObjective])
