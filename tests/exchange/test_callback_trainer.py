"""The callback inside a real (tiny, model-free) Lightning fit: hooks open/close steps, flow counts are logged,
and the totals are checkpointed and restored."""

from __future__ import annotations

from mutual_rl.exchange import ExperienceExchange
from tests.exchange.helpers import fit_exchange as _fit


def test_callback_in_a_trainer_logs_and_checkpoints(tmp_path):
    ex = ExperienceExchange(store_dir=str(tmp_path / "traffic"))
    trainer = _fit(tmp_path, ex, 3)
    assert ex.totals()["a->b"] == {"delivered": 6, "consumed": 3, "dropped/gate_closed": 3}
    assert trainer.callback_metrics["exchange/b->a/dropped/gate_closed"] == 1.0
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    resumed = ExperienceExchange()
    _fit(tmp_path, resumed, 5, ckpt=str(tmp_path / "c.ckpt"))
    assert resumed.totals()["a->b"] == {"delivered": 10, "consumed": 5, "dropped/gate_closed": 5}
    assert sorted(p.name for p in (tmp_path / "traffic").iterdir())[-1] == "step-000002.jsonl"
