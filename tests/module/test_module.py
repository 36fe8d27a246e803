"""MutualRLModule end to end on two heterogeneous tiny policies (CPU, seconds)."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from tests.module.helpers import datamodule, module, pair, trainer

pytestmark = pytest.mark.slow  # Lightning fits


def _snapshot(m):
    return {k: v.detach().clone() for k, v in m.named_parameters() if v.requires_grad}


def test_two_policy_run_changes_every_trainable_parameter(tmp_path):
    pl.seed_everything(0)
    m, dm = module(pair()), datamodule()
    trainer(tmp_path, max_steps=0).fit(m, datamodule=dm)  # builds the policies (configure_model)
    before = _snapshot(m)
    assert {k.split(".")[1] for k in before} == {"gpt2", "llama"}
    t = trainer(tmp_path, max_steps=2)
    t.fit(m, datamodule=dm)
    after = _snapshot(m)
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert unchanged == [], f"parameters not updated: {unchanged}"
    assert t.global_step == 2  # training steps, not optimizer steps (2 policies x 2 mini-batches each)
    assert all(p.version == 2 * 2 for p in m.policies.values())
    # HF export of every policy at the end of fit
    for name in ("gpt2", "llama"):
        assert (tmp_path / "export" / name / "config.json").exists()
        assert (tmp_path / "export" / name / "tokenizer.json").exists()


def test_lora_trains_only_adapters(tmp_path):
    pl.seed_everything(0)
    m, dm = module(pair(lora=True)), datamodule()
    trainer(tmp_path, max_steps=0).fit(m, datamodule=dm)
    before = {k: v.detach().clone() for k, v in m.named_parameters()}
    trainable = {k for k, v in m.named_parameters() if v.requires_grad}
    assert trainable and all("lora_" in k for k in trainable)
    trainer(tmp_path, max_steps=2).fit(m, datamodule=dm)
    after = dict(m.named_parameters())
    changed = {k for k in before if not torch.equal(before[k], after[k].detach())}
    assert changed == trainable  # every adapter moved, nothing else did


class _Record(Callback):
    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        keys = ("gpt2/loss", "llama/loss", "gpt2/reward", "llama/reward", "gpt2/grad_norm", "llama/grad_norm")
        self.rows.append({k: float(trainer.callback_metrics[k]) for k in keys})


def test_resume_continues_with_the_same_next_step(tmp_path):
    pl.seed_everything(0)
    rec_full = _Record()
    trainer(tmp_path / "full", max_steps=3, callbacks=[rec_full]).fit(module(pair()), datamodule=datamodule())

    pl.seed_everything(0)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    trainer(tmp_path / "a", max_steps=2, callbacks=[ckpt], enable_checkpointing=True).fit(
        module(pair()), datamodule=datamodule()
    )
    path = next((tmp_path / "ckpt").glob("*step=2*.ckpt"))

    pl.seed_everything(123)  # a different seed: everything must come from the checkpoint
    rec_resumed = _Record()
    trainer(tmp_path / "b", max_steps=3, callbacks=[rec_resumed], enable_checkpointing=True).fit(
        module(pair()), datamodule=datamodule(), ckpt_path=path
    )
    assert len(rec_resumed.rows) == 1
    for k, v in rec_full.rows[2].items():
        assert rec_resumed.rows[0][k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
