"""ResourceAllocation in a real tiny Trainer: budgets reach the module, accounting and EMA survive resume."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from mutual_rl.allocation import Budget
from mutual_rl.callbacks import ResourceAllocation
from mutual_rl.interfaces import RolloutEngine
from mutual_rl.rollout import HFRolloutEngine, as_engine
from tests.module.helpers import datamodule, module, pair, trainer


class _Spy(Callback):
    def __init__(self):
        self.budgets, self.metrics = [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.budgets.append(dict(pl_module.budgets))
        self.metrics.append({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("alloc/")})


def _alloc():
    return ResourceAllocation(mode="adaptive", total_rollouts=8, n_min=2, eps=0.1, ema_decay=0.5,
                              update_every={"llama": 2})


@pytest.mark.slow
def test_budgets_reach_module_and_are_logged(tmp_path):
    pl.seed_everything(0)
    spy, alloc = _Spy(), _alloc()
    trainer(tmp_path, max_steps=2, callbacks=[alloc, spy]).fit(module(pair()), datamodule=datamodule())
    assert [b["llama"].update for b in spy.budgets] == [True, False]
    for b in spy.budgets:
        assert sum(x.n for x in b.values()) == 8 and all(isinstance(x, Budget) for x in b.values())
    assert spy.budgets[0]["gpt2"].n == spy.budgets[0]["llama"].n == 4  # no statistics yet: equal
    totals = alloc.accounting.totals
    assert totals["gpt2"].updates == 2 and totals["llama"].updates == 1 and totals["llama"].steps == 2
    assert totals["gpt2"].generated_tokens > 0 and totals["gpt2"].wall_s > 0
    assert totals["gpt2"].device_s == pytest.approx(totals["gpt2"].wall_s)  # one CPU device
    last = spy.metrics[-1]
    assert last["alloc/gpt2/steps_total"] == 2 and last["alloc/llama/update"] == 0.0
    assert set(alloc.all_fail_ema) == {"gpt2", "llama"}


@pytest.mark.slow
def test_accounting_survives_resume(tmp_path):
    pl.seed_everything(0)
    full = _alloc()
    trainer(tmp_path / "full", max_steps=4, callbacks=[full]).fit(module(pair()), datamodule=datamodule())

    pl.seed_everything(0)
    first = _alloc()
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    trainer(tmp_path / "a", max_steps=2, callbacks=[first, ckpt], enable_checkpointing=True).fit(
        module(pair()), datamodule=datamodule())
    path = next((tmp_path / "ckpt").glob("*step=2*.ckpt"))
    at_ckpt = first.state_dict()

    pl.seed_everything(123)
    resumed, spy = _alloc(), _Spy()
    trainer(tmp_path / "b", max_steps=4, callbacks=[resumed, spy], enable_checkpointing=True).fit(
        module(pair()), datamodule=datamodule(), ckpt_path=path)
    assert len(spy.budgets) == 2 and resumed.steps == full.steps == 4
    for name in ("gpt2", "llama"):
        r, f = resumed.accounting.totals[name], full.accounting.totals[name]
        assert (r.steps, r.updates) == (f.steps, f.updates)
        assert r.generated_tokens == pytest.approx(f.generated_tokens)
        assert r.trained_tokens == pytest.approx(f.trained_tokens)
        assert r.wall_s > at_ckpt["accounting"][name]["wall_s"]  # continued, not restarted
        assert resumed.all_fail_ema[name] == pytest.approx(full.all_fail_ema[name])


def test_setup_rejects_unknown_policy_and_never_updating(tmp_path):
    for cb, match in ((ResourceAllocation(placement={"nobody": 0}), "unknown policy 'nobody'"),
                      (ResourceAllocation(update_every={"gpt2": 0}), "never updates"),
                      (ResourceAllocation(mode="adaptive", total_rollouts=3), "n_min")):
        with pytest.raises(ValueError, match=match):
            trainer(tmp_path, max_steps=1, callbacks=[cb]).fit(module(pair()), datamodule=datamodule())


def test_constructor_rejects_bad_arguments():
    for kw, match in ((dict(mode="x"), "not one of"), (dict(ema_decay=1.0), "ema_decay"),
                      (dict(total_rollouts=0), "total_rollouts"), (dict(placement={"a": "gpu"}), "device index")):
        with pytest.raises(ValueError, match=match):
            ResourceAllocation(**kw)


class _Placing(RolloutEngine):
    """An HF engine that records the placements the module hands it each step (``engine``: the one it replaces)."""

    def __init__(self, engine):
        self.engine, self.calls = HFRolloutEngine(), []

    def generate(self, *args, **kwargs):
        return self.engine.generate(*args, **kwargs)

    def place(self, name, placement):
        self.calls.append((name, placement))
        self.engine.place(name, placement)


def test_module_hands_each_budgets_placement_to_the_engine(tmp_path):
    m = module(pair())
    m.engine = _Placing(m.engine)
    trainer(tmp_path, max_steps=2, callbacks=[ResourceAllocation(placement={"llama": "colocate"})]).fit(
        m, datamodule=datamodule())
    assert m.engine.calls == [("llama", "colocate")] + [("gpt2", "colocate"), ("llama", "colocate")] * 2


@pytest.mark.parametrize("engine", ["hf", "auto"])
def test_no_engine_places_rollouts_on_another_device(tmp_path, engine):
    m = module(pair())
    m.engine = as_engine(engine)
    with pytest.raises(ValueError, match="placement of policy 'gpt2' is device 1, .* use placement 'colocate'"):
        trainer(tmp_path, max_steps=1, callbacks=[ResourceAllocation(placement={"gpt2": 1})]).fit(
            m, datamodule=datamodule())
