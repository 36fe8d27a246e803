"""Every regime under ordinary options in combination: KL on, LoRA on/off, a prompt file whose problems repeat
within a batch, three policies. Two training steps each, through the Lightning trainer.

What each run must show: the exchange accounts for every delivered response (the callback raises otherwise),
every policy's weights changed, the KL metric is logged and finite, and the per-step metrics are finite.
"""

from __future__ import annotations

import json
import math

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from mutual_rl.data.datamodule import PromptDataModule
from mutual_rl.exchange import ExperienceExchange
from mutual_rl.module import MutualRLModule
from mutual_rl.regimes import get_regime
from mutual_rl.update.config import GRPOConfig
from tests.module.helpers import pair, spec, trainer

pytestmark = pytest.mark.slow  # two Lightning training steps per case

REGIMES = [
    ("none", {}),
    ("xgrpo", {}),
    ("prp", {}),
    ("prp", {"denominator": "peer_aligned"}),
    ("sgt", {"coef": 0.3}),
    ("graft", {"delta": 0.0}),
    ("hacpo", {}),
    ("ftis", {}),
    ("graft", {"update_rule": "hacpo"}),  # GRAFT §6.3's cross rules
    ("graft", {"update_rule": "sgt"}),
]


class _Metrics(Callback):
    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def repeated_file(tmp_path, rows: int = 3):
    """A prompt file of identical problems: with batch_size 4 every batch repeats a prompt id."""
    path = tmp_path / "same.jsonl"
    path.write_text("".join(json.dumps({"problem": "12+34=", "answer": "46"}) + "\n" for _ in range(rows)))
    return str(path)


def run(tmp_path, regime, args, *, lora: bool, trio: bool, kl: float = 1e-3, steps: int = 2,
        reward: str = "test_parity"):
    pl.seed_everything(0)
    specs = pair(lora=lora, lr=1e-3) + ([spec("llama_bpe", "tiny:llama-bpe", lora=lora)] if trio else [])
    m = MutualRLModule(specs, algorithm=GRPOConfig(num_mini_batches=2, kl_coef=kl), regime=get_regime(regime, **args),
                       reward=reward, log_samples_every_n_steps=0)
    dm = PromptDataModule(train_files=[repeated_file(tmp_path)], val_files=[repeated_file(tmp_path)],
                          batch_size=4, val_batch_size=4)
    rec, ex = _Metrics(), ExperienceExchange()
    t = trainer(tmp_path, max_steps=0)
    t.fit(m, datamodule=dm)  # builds the policies
    before = {k: v.detach().clone() for k, v in m.named_parameters() if v.requires_grad}
    trainer(tmp_path, max_steps=steps, callbacks=[rec, ex]).fit(m, datamodule=dm)
    return m, rec, ex, before


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("regime,args", REGIMES, ids=[f"{r}-{a.get('denominator', a.get('update_rule', ''))}" for r, a in REGIMES])
def test_regime_with_kl_lora_repeated_prompts(regime, args, lora, tmp_path):
    trio = not lora  # three policies with full fine-tuning, two with LoRA (keeps the suite short)
    m, rec, ex, before = run(tmp_path, regime, args, lora=lora, trio=trio)
    names = [s.name for s in m.specs]
    assert len(rec.rows) == 2
    for name in names:
        changed = [k for k, v in m.named_parameters() if k.startswith(f"policies.{name}.") and v.requires_grad
                   and not torch.equal(before[k], v)]
        assert changed, f"{name}: no parameter changed"
        if lora:
            assert all("lora_" in k for k in changed)
        kl = [r[f"{name}/kl"] for r in rec.rows if f"{name}/kl" in r]
        assert kl and all(math.isfinite(v) and v >= 0 for v in kl), (name, kl)
    if regime in ("prp", "hacpo", "ftis"):  # regimes that carry every peer response across: THL residual per direction
        for r in names:
            for src in names:
                if src != r:
                    v = rec.rows[0][f"thl/{src}->{r}/residual_mean"]
                    assert math.isfinite(v) and v >= 0, (src, r, v)
    for flow, counts in ex.totals().items():  # every delivered response consumed or dropped, none twice
        dropped = sum(v for k, v in counts.items() if k.startswith("dropped/"))
        assert counts.get("consumed", 0) + dropped == counts["delivered"], flow
        assert counts["delivered"] == 2 * 4 * 4  # 2 steps x 4 prompts (one repeated) x 4 responses
