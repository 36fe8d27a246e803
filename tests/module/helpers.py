"""Small builders for trainer tests: tiny specs, a tiny data module, a quiet Trainer."""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from mutual_rl.data.datamodule import PromptDataModule
from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.spec import LoraSpec, OptimizerSpec, PolicySpec, SamplingSpec, WarmStart
from mutual_rl.module import MutualRLModule
from mutual_rl.update.config import GRPOConfig

TASK = dict(operators=["+", "-"], digits=2, num_train=2000, num_heldout=50)


def spec(name: str, model: str, *, lr: float = 1e-3, wd: float = 0.0, lora: bool = False, n: int = 4) -> PolicySpec:
    return PolicySpec(
        name=name, model=model, optimizer=OptimizerSpec(lr=lr, weight_decay=wd),
        sampling=SamplingSpec(n=n, max_new_tokens=5), warmstart=WarmStart(steps=20),
        lora=LoraSpec(r=4, alpha=8) if lora else None,
    )


def pair(**kw) -> list[PolicySpec]:
    return [spec("gpt2", "tiny:gpt2-bpe", **kw), spec("llama", "tiny:llama-char", **kw)]


def module(specs, reward: str = "test_parity", **algo) -> MutualRLModule:
    algo = {"num_mini_batches": 2, **algo}
    return MutualRLModule(specs, algorithm=GRPOConfig(**algo), reward=reward, log_samples_every_n_steps=0)


def datamodule(batch_size: int = 4) -> PromptDataModule:
    return PromptDataModule(task=ArithmeticTask(**TASK), batch_size=batch_size, val_batch_size=32, val_per_skill=8)


def trainer(tmp_path, max_steps: int = 2, **kw) -> pl.Trainer:
    defaults = dict(
        max_steps=max_steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=str(tmp_path),
    )
    defaults.update(kw)
    return pl.Trainer(**defaults)


class RecordMetrics(Callback):
    """``rows``: ``trainer.callback_metrics`` after each training step, as floats."""

    def __init__(self):
        self.rows: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def fit_command(cfg, *extra: str) -> list[str]:
    """``python -m mutual_rl.cli fit --config cfg ...`` with this interpreter (subprocess runs of the CLI)."""
    import sys

    return [sys.executable, "-m", "mutual_rl.cli", "fit", "--config", str(cfg), *extra]


def subprocess_env() -> dict:
    """The environment of a subprocess run: one torch thread, and this repository importable (test callbacks)."""
    import os
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
