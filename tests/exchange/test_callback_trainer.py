"""The callback inside a real (tiny, model-free) Lightning fit: hooks open/close steps, flow counts are logged,
and the totals are checkpointed and restored."""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader

from mutual_rl.exchange import ExperienceExchange
from tests.exchange.helpers import make_group


class _Module(LightningModule):
    def __init__(self, exchange):
        super().__init__()
        self.automatic_optimization = False
        self.exchange = exchange
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        step = self.global_step
        for p in ("a", "b"):
            self.exchange.publish(make_group(p, int(batch[0]), 0, n=2, step=step))
        for r in ("a", "b"):
            for s, gs in self.exchange.deliveries(r).items():
                self.exchange.report(r, s, consumed=1, dropped={"gate_closed": 2 * len(gs) - 1})
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward((self.w**2).sum() + 1)
        opt.step()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(tmp_path, exchange, max_steps, ckpt=None):
    exchange.subscribe("a", {"rollout"})
    exchange.subscribe("b", {"reward"})
    trainer = Trainer(max_steps=max_steps, callbacks=[exchange], default_root_dir=tmp_path, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                      enable_checkpointing=False)
    module = _Module(exchange)
    trainer.fit(module, DataLoader(torch.arange(100)), ckpt_path=ckpt)
    return trainer


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
