"""Sharing regimes inside the trainer: 3 policies, exchange accounting, stored-peer replay."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from mutual_rl.exchange import ExperienceExchange
from mutual_rl.module import MutualRLModule
from mutual_rl.regimes import get_regime
from mutual_rl.rewards import register_reward
from mutual_rl.rewards.base import available_rewards
from mutual_rl.update.config import GRPOConfig
from tests.module.helpers import datamodule, pair, spec, trainer

pytestmark = pytest.mark.slow  # Lightning fits


if "test_never" not in available_rewards():

    @register_reward("test_never")
    def _never(completion: str, answer: str) -> float:
        """Test-only reward that no response earns (every group of its policy fails entirely)."""
        return 0.0


def _trio():
    return pair() + [spec("llama_bpe", "tiny:llama-bpe")]


class _Metrics(Callback):
    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows.append({k: float(v) for k, v in trainer.callback_metrics.items()})


@pytest.mark.parametrize("regime,args", [("sgt", {"coef": 0.3}), ("graft", {"delta": 0.5})])
def test_three_policies(regime, args, tmp_path):
    pl.seed_everything(0)
    m = MutualRLModule(_trio(), algorithm=GRPOConfig(num_mini_batches=2), regime=get_regime(regime, **args),
                       reward="test_parity", log_samples_every_n_steps=0)
    rec = _Metrics()
    ex = ExperienceExchange()
    trainer(tmp_path, max_steps=2, callbacks=[rec, ex]).fit(m, datamodule=datamodule())
    names = ["gpt2", "llama", "llama_bpe"]
    totals = ex.totals()
    flows = {f"{s}->{d}" for s in names for d in names if s != d}
    assert set(totals) == flows
    # something crossed, and what the exchange counts as consumed is what the receivers trained on
    consumed = sum(c.get("consumed", 0) for c in totals.values())
    key = {"sgt": "rescued", "graft": "transferred_responses"}[regime]
    assert consumed >= 1 and consumed == sum(r[f"{n}/{key}"] for r in rec.rows for n in names), consumed
    for flow, counts in totals.items():
        assert counts["delivered"] == 2 * 4 * 4  # 2 steps x 4 prompts x 4 responses, every peer group
        assert counts.get("consumed", 0) + sum(v for k, v in counts.items() if k.startswith("dropped/")) \
            == counts["delivered"], flow
    assert all(f"{n}/loss" in rec.rows[-1] for n in names)


def test_stored_peer_replay(tmp_path):
    """A co-trained run records its traffic; a second run trains one receiver against the recorded peer."""
    store = tmp_path / "traffic"
    pl.seed_everything(0)
    m = MutualRLModule(pair(), algorithm=GRPOConfig(num_mini_batches=2), regime="sgt", reward="test_parity",
                       log_samples_every_n_steps=0)
    trainer(tmp_path / "a", max_steps=2, callbacks=[ExperienceExchange(store_dir=str(store))]).fit(
        m, datamodule=datamodule())
    assert sorted(p.name for p in store.iterdir()) == ["step-000000.jsonl", "step-000001.jsonl"]

    pl.seed_everything(0)
    # the receiver scores its own responses with a reward it never earns, so each of its groups fails entirely and
    # every recorded peer group with mixed rewards (scored by the recording run) is a GRAFT candidate
    receiver = MutualRLModule([spec("llama", "tiny:llama-char")], algorithm=GRPOConfig(num_mini_batches=2),
                              regime=get_regime("graft", balance=False, delta=0.0), reward="test_never",
                              log_samples_every_n_steps=0)
    trainer(tmp_path / "b", max_steps=0).fit(receiver, datamodule=datamodule())
    before = {k: v.detach().clone() for k, v in receiver.named_parameters()}
    rec = _Metrics()
    ex = ExperienceExchange(replay_dir=str(store), replay_policies=["gpt2"])
    trainer(tmp_path / "c", max_steps=2, callbacks=[rec, ex]).fit(receiver, datamodule=datamodule())
    assert [r["exchange/gpt2->llama/delivered"] for r in rec.rows] == [16.0, 16.0]
    assert "gpt2/reward" in rec.rows[0]
    assert any(not torch.equal(before[k], v) for k, v in receiver.named_parameters())
    # the recorded peer's responses were grafted, not only delivered: a dead transfer path fails here
    grafted = [r["llama/transferred_responses"] for r in rec.rows]
    assert all(g >= 1 for g in grafted), grafted
    assert ex.totals()["gpt2->llama"]["consumed"] == sum(grafted)
