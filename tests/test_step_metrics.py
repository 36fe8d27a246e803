"""What reaches the loggers each step: no key repeats a stale value from an earlier step (step_metrics.fill_absent).

Lightning logs a key's last value again at every later step in which the module does not log it; before
fill_absent, a drop reason of one step (``exchange/a->b/dropped/not_drawn``) reappeared in every later row of the
TensorBoard/CSV log, so consumed + dropped exceeded delivered, and THL residuals repeated between measurements.
"""

from __future__ import annotations

import csv
import math

from lightning.pytorch.loggers import CSVLogger

from mutual_rl.exchange import ExperienceExchange
from mutual_rl.regimes import SGT
from mutual_rl.rewards import register_reward
from mutual_rl.rewards.base import available_rewards
from mutual_rl.step_metrics import fill_absent
from tests.module.helpers import datamodule, module, pair, trainer

if "test_len_mod3" not in available_rewards():

    @register_reward("test_len_mod3")
    def _len_mod3(completion: str, answer: str) -> float:
        """1 iff the response length is a multiple of 3: all-fail groups of 4 are common (~20 %), so SGT's gate
        opens and every drop reason occurs within a few steps."""
        return float(len(completion) % 3 == 0)


def test_fill_absent_zero_for_counts_nan_otherwise():
    seen: set[str] = set()
    counts = {"exchange/a->b/dropped/x", "a/reward_errors"}
    fill_absent({"exchange/a->b/dropped/x": 2.0, "a/entropy": 1.0, "a/reward_errors": 1.0, "a/lr": 1e-3}, seen, counts)
    now = {"a/lr": 1e-3}
    fill_absent(now, seen, counts)
    assert now["exchange/a->b/dropped/x"] == 0.0 and now["a/reward_errors"] == 0.0
    assert math.isnan(now["a/entropy"]) and now["a/lr"] == 1e-3
    assert seen == {"exchange/a->b/dropped/x", "a/entropy", "a/reward_errors", "a/lr"}


def test_logged_rows_add_up_and_residuals_leave_gaps(tmp_path):
    m = module(pair(n=4), reward="test_len_mod3")
    m.regimes = {name: SGT(coef=0.3) for name in m.regimes}
    m.thl_residual_every_n_steps = 2
    logger = CSVLogger(str(tmp_path), name="rows", version=0)
    trainer(tmp_path, max_steps=5, logger=logger, log_every_n_steps=1,
            callbacks=[ExperienceExchange()]).fit(m, datamodule=datamodule())
    rows = [r for r in csv.DictReader(open(tmp_path / "rows" / "version_0" / "metrics.csv")) if r.get("reward")]
    assert len(rows) == 5
    flows = {k.rsplit("/", 1)[0] for k in rows[0] if k.startswith("exchange/") and k.endswith("/delivered")}
    assert flows == {"exchange/gpt2->llama", "exchange/llama->gpt2"}
    reasons = set()
    for row in rows:
        for f in flows:
            delivered = float(row[f"{f}/delivered"])
            parts = {k: float(v) for k, v in row.items() if k.startswith(f + "/") and v not in ("", None)
                     and not k.endswith("/delivered")}
            reasons.update(k for k, v in parts.items() if v > 0)
            assert delivered == 16 and sum(parts.values()) == delivered, (row["step"], f, parts)
    assert {r.rsplit("/", 1)[1] for r in reasons} >= {"consumed", "gate_closed", "not_success"}
    residual = [k for k in rows[0] if k.endswith("/residual_mean")]
    assert residual
    measured = set()
    for step, row in enumerate(rows):  # measured every 2nd step (where that direction crossed), a gap between
        for k in residual:
            if math.isfinite(float(row[k]) if row[k] not in ("", None) else math.nan):
                measured.add(step)
    assert measured and all(step % 2 == 0 for step in measured), measured
