"""Per-policy LR schedules (warm-up, cosine/linear decay) and periodic Hugging Face exports."""

from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from transformers import AutoModelForCausalLM

from mutual_rl.model.spec import OptimizerSpec
from mutual_rl.resume import apply_optimizer_settings
from mutual_rl.update.schedule import decay_end, lr_factor
from tests.module.helpers import datamodule, module, pair, trainer


def test_lr_factor_hand_values():
    cos = OptimizerSpec(lr=1.0, warmup_steps=4, schedule="cosine", decay_steps=10, min_lr_ratio=0.1)
    lin = OptimizerSpec(lr=1.0, warmup_steps=4, schedule="linear", decay_steps=10, min_lr_ratio=0.1)
    const = OptimizerSpec(lr=1.0, warmup_steps=4)
    for o in (cos, lin, const):  # warm-up: (s + 1) / W, never 0
        assert [lr_factor(o, s, 10) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(cos, 4, 10) == 1.0 and lr_factor(lin, 4, 10) == 1.0
    assert lr_factor(cos, 5, 10) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi / 6)) / 2, abs=1e-12)
    assert lr_factor(lin, 5, 10) == pytest.approx(0.1 + 0.9 * 5 / 6, abs=1e-12)
    assert lr_factor(cos, 7, 10) == pytest.approx(0.55, abs=1e-12) == lr_factor(lin, 7, 10)
    assert lr_factor(cos, 10, 10) == pytest.approx(0.1) and lr_factor(cos, 50, 10) == pytest.approx(0.1)
    assert lr_factor(const, 50, None) == 1.0


def test_decay_end_and_field_errors():
    assert decay_end(OptimizerSpec(schedule="cosine"), 200, "a") == 200
    assert decay_end(OptimizerSpec(schedule="cosine", decay_steps=50), 200, "a") == 50
    assert decay_end(OptimizerSpec(warmup_steps=5), -1, "a") is None  # constant after warm-up: no end needed
    with pytest.raises(ValueError, match=r"policy 'a'.*decay_steps.*max_steps is unbounded"):
        decay_end(OptimizerSpec(schedule="linear"), -1, "a")
    with pytest.raises(ValueError, match=r"not after optimizer.warmup_steps = 20"):
        decay_end(OptimizerSpec(schedule="linear", warmup_steps=20), 10, "a")
    with pytest.raises(ValueError, match="decay_steps .5. must be > warmup_steps .5."):
        OptimizerSpec(schedule="cosine", warmup_steps=5, decay_steps=5)
    with pytest.raises(ValueError, match="min_lr_ratio"):
        OptimizerSpec(min_lr_ratio=1.5)
    with pytest.raises(ValueError, match="warmup_steps must be >= 0"):
        OptimizerSpec(warmup_steps=-1)


def test_resume_keeps_a_scheduled_lr():
    notes = []
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=3e-5)
    spec = pair()[0]
    spec.optimizer = OptimizerSpec(lr=1e-4, warmup_steps=10)
    apply_optimizer_settings(spec, opt, notes.append)
    assert opt.param_groups[0]["lr"] == 3e-5 and not any("optimizer.lr" in n for n in notes)
    spec.optimizer = OptimizerSpec(lr=1e-4)
    apply_optimizer_settings(spec, opt, notes.append)
    assert opt.param_groups[0]["lr"] == 1e-4 and any("optimizer.lr 3e-05 -> 0.0001" in n for n in notes)


class _RecordLR(Callback):
    def __init__(self):
        self.seen: dict[str, list[float]] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        for spec, opt in zip(pl_module.specs, trainer.optimizers):
            self.seen.setdefault(spec.name, []).append(opt.param_groups[0]["lr"])
            assert trainer.callback_metrics[f"{spec.name}/lr"] == pytest.approx(opt.param_groups[0]["lr"])


@pytest.mark.slow
def test_schedule_in_a_run_per_policy_and_periodic_export(tmp_path):
    specs = pair(lr=1e-3)
    specs[0].optimizer = OptimizerSpec(lr=1e-3, weight_decay=0.0, warmup_steps=2, schedule="linear")
    specs[1].optimizer = OptimizerSpec(lr=2e-3, weight_decay=0.0)  # the other policy keeps a constant lr
    m = module(specs)
    m.export_dir, m.export_every_n_steps = str(tmp_path / "export"), 2
    rec = _RecordLR()
    trainer(tmp_path, max_steps=4, callbacks=[rec]).fit(m, datamodule=datamodule())
    # linear to 0 at max_steps = 4 after 2 warm-up steps: 0.5, 1, then p = 0, 0.5
    assert rec.seen["gpt2"] == pytest.approx([5e-4, 1e-3, 1e-3, 5e-4], rel=1e-12)
    assert rec.seen["llama"] == pytest.approx([2e-3] * 4, rel=1e-12)
    root = tmp_path / "export"
    assert sorted(p.name for p in root.iterdir()) == ["gpt2", "llama", "step-000002", "step-000004"]
    assert sorted(p.name for p in (root / "step-000002").iterdir()) == ["gpt2", "llama"]
    # the step-2 export holds the weights of step 2, not the final ones; the step-4 one equals the final export
    final = m.policies["gpt2"].model.state_dict()
    at2 = AutoModelForCausalLM.from_pretrained(root / "step-000002" / "gpt2").state_dict()
    at4 = AutoModelForCausalLM.from_pretrained(root / "step-000004" / "gpt2").state_dict()
    end = AutoModelForCausalLM.from_pretrained(root / "gpt2").state_dict()
    key = next(k for k in at2 if k.endswith("mlp.c_fc.weight"))
    assert not torch.equal(at2[key], final[key])
    assert all(torch.equal(at4[k], end[k]) for k in at4)
    assert torch.equal(end[key], final[key])
    assert not list(root.glob(".*"))  # no temporary or moved-aside folder left behind


def test_export_every_n_steps_must_be_non_negative():
    with pytest.raises(ValueError, match="export_every_n_steps must be >= 0"):
        type(module(pair()))(pair(), export_every_n_steps=-1)


def test_a_failed_export_write_raises_and_keeps_the_previous_export(tmp_path, monkeypatch):
    from mutual_rl.model.export import export_policies

    m = module(pair())
    m.configure_model()
    root = tmp_path / "export"
    export_policies(m.policies, root, write=True)
    before = (root / "gpt2" / "config.json").read_text()

    def full_disk(path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(m.policies["llama"], "export", full_disk)
    with pytest.raises(OSError, match=r"no space left on the device writing the export of policy 'llama' to "):
        export_policies(m.policies, root, write=True)
    assert (root / "gpt2" / "config.json").read_text() == before and (root / "llama" / "config.json").exists()
