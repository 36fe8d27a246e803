"""One step builder (``mutual_rl.step.build``): ``mutual-rl fit`` (MutualRLModule under Lightning) and the Python API
(``StepContext.from_policies`` + ``run_step``) run the same configuration to the same weights and reports.

The configuration: two heterogeneous tiny policies, a cosine learning-rate schedule with a linear warm-up whose
decay ends at ``max_steps`` (the API is given the same ``max_steps``), a per-policy regime (llama's own SGT, gpt2 the
shared GRAFT) and a KL term to the reference. The step seeds nothing: it draws from the process's sampling streams
(``mutual_rl.rng``). Both paths seed them alike, build the policies, then open the data module's training loader
(Lightning opens it once per epoch; opening a ``DataLoader`` draws its base seed from torch's stream), so every step
starts from the same streams without any being put back by hand -- the test checks that before it checks the rest.
"""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import OptimizerSpec, PolicySpec, SamplingSpec, WarmStart
from mutual_rl.module import MutualRLModule
from mutual_rl.rng import rng_state
from mutual_rl.step import StepContext, run_step
from mutual_rl.update.config import GRPOConfig
from tests.module.helpers import datamodule, trainer

pytestmark = pytest.mark.slow  # a Lightning fit and the same three steps again

STEPS, LR = 3, 1e-3
ALGORITHM = dict(num_mini_batches=2, kl_coef=0.05)
SHARED_REGIME = "graft"


def _specs() -> list[PolicySpec]:
    common = dict(sampling=SamplingSpec(n=4, max_new_tokens=5), warmstart=WarmStart(steps=20))
    return [
        # warm-up over two steps, then cosine (decay end: max_steps)
        PolicySpec(name="gpt2", model="tiny:gpt2-bpe", optimizer=OptimizerSpec(
            lr=LR, weight_decay=0.0, warmup_steps=2, schedule="cosine"), **common),
        # one warm-up step, then cosine to a floor of 0.1 lr at max_steps; its own regime over the shared one
        PolicySpec(name="llama", model="tiny:llama-char", regime="sgt", optimizer=OptimizerSpec(
            lr=LR, weight_decay=0.0, warmup_steps=1, schedule="cosine", min_lr_ratio=0.1), **common),
    ]


#: the learning rate of each step (update/schedule.py): gpt2 (s+1)/2 then cos; llama 1, then 0.1 + 0.9 (1+cos(pi p))/2
EXPECTED_LR = {"gpt2": [LR * 0.5, LR, LR], "llama": [LR, LR, LR * (0.1 + 0.9 * 0.5)]}


def _timing(key: str) -> bool:
    """Wall-clock figures (seconds, tokens per second): the only values two identical runs do not share."""
    return key.endswith(("_s", "_per_s"))


class _Record(Callback):
    """Each step's batch, sampling streams at its start, report and logged values."""

    def __init__(self):
        self.batches, self.rngs, self.reports, self.logged = [], [], [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append(batch)
        self.rngs.append(rng_state())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.reports.append(pl_module.last_report)
        self.logged.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def _fit(tmp_path):
    pl.seed_everything(0)
    m = MutualRLModule(_specs(), algorithm=GRPOConfig(**ALGORITHM), regime=SHARED_REGIME, reward="test_parity",
                       log_samples_every_n_steps=0)
    record = _Record()
    t = trainer(tmp_path, max_steps=STEPS, callbacks=[record])
    t.fit(m, datamodule=datamodule())
    return m, t, record


def _api():
    """The same three steps as a script runs them: seed, build, set up the step, open the loader, step."""
    pl.seed_everything(0)
    algorithm = GRPOConfig(**ALGORITHM)
    dm = datamodule()
    policies = [build_policy(s, task=dm.task, needs_reference=algorithm.kl_coef > 0) for s in _specs()]
    ctx = StepContext.from_policies(policies, SHARED_REGIME, reward="test_parity", algorithm=algorithm,
                                    max_steps=STEPS)
    batches, rngs, reports = [], [], []
    for step, batch in zip(range(STEPS), dm.train_dataloader()):
        batches.append(batch)
        rngs.append(rng_state())
        reports.append(run_step(ctx, batch, step))
    return policies, ctx, batches, rngs, reports


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_fit_and_the_python_api_give_the_same_weights_and_reports(tmp_path):
    m, t, fit = _fit(tmp_path)
    assert t.global_step == STEPS and len(fit.reports) == STEPS
    policies, ctx, batches, rngs, reports = _api()

    # the same set-up: regimes (per policy over the shared one), subscriptions, decay ends
    assert {n: type(r).__name__ for n, r in ctx.regimes.items()} == {"gpt2": "GRAFT", "llama": "SGT"}
    assert {n: type(r).__name__ for n, r in m.regimes.items()} == {"gpt2": "GRAFT", "llama": "SGT"}
    assert ctx.decay_ends == m._decay_ends == {"gpt2": STEPS, "llama": STEPS}
    assert ctx.exchange.subscriptions == m.exchange.subscriptions

    # the same batches, and the same sampling streams at the start of every step (nothing put back by hand)
    for i in range(STEPS):
        assert batches[i].index == fit.batches[i].index and batches[i].offset == fit.batches[i].offset
        assert [p.prompt_id for p in batches[i].problems] == [p.prompt_id for p in fit.batches[i].problems]
        assert torch.equal(rngs[i]["torch"], fit.rngs[i]["torch"]), f"step {i}: torch's stream differs"
        assert rngs[i]["python"] == fit.rngs[i]["python"], f"step {i}: Python's stream differs"

    # identical weights (bit for bit: same streams, same ops in the same order, and the thread count the fit set,
    # model.num_threads, still in force) and AdamW states
    for p in policies:
        theirs = m.policies[p.name].state_dict()
        ours = p.state_dict()
        assert theirs.keys() == ours.keys()
        different = [k for k in ours if not torch.equal(ours[k], theirs[k])]
        assert different == [], f"{p.name}: {different[:5]}"
    for spec, opt in zip(m.specs, t.optimizers):
        ours, theirs = ctx.optimizers[spec.name].state_dict(), opt.state_dict()
        assert [g["lr"] for g in ours["param_groups"]] == [g["lr"] for g in theirs["param_groups"]]
        for k, s in ours["state"].items():
            assert all(torch.equal(v, theirs["state"][k][n]) for n, v in s.items()), f"{spec.name}: AdamW state {k}"

    # identical reports and logged values, the learning rate of every step included
    for i in range(STEPS):
        ours, theirs = reports[i].metrics(), fit.reports[i].metrics()
        assert ours.keys() == theirs.keys()
        different = {k: (ours[k], theirs[k]) for k in ours if not _timing(k) and not _same(ours[k], theirs[k])}
        assert different == {}, f"step {i}"
        logged = fit.logged[i]
        different = {k: (ours[k], logged[k]) for k in ours
                     if not _timing(k) and not _same(float(torch.tensor(ours[k], dtype=torch.float32)), logged[k])}
        assert different == {}, f"step {i}: logged"
        for name in ("gpt2", "llama"):
            assert reports[i].policies[name].update.lr == fit.reports[i].policies[name].update.lr
            assert reports[i].policies[name].update.lr == pytest.approx(EXPECTED_LR[name][i], rel=1e-12)
            ours_r = [r for g in reports[i].policies[name].groups for r in g.rollouts]
            theirs_r = [r for g in fit.reports[i].policies[name].groups for r in g.rollouts]
            assert len(ours_r) == len(theirs_r)
            assert all(torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logp, b.logp)
                       for a, b in zip(ours_r, theirs_r)), f"step {i}: {name}'s rollouts"
    assert any(reports[i].policies["llama"].update.trained_tokens for i in range(STEPS))  # the steps trained


def test_a_decaying_schedule_without_an_end_is_one_error_naming_the_policy():
    """``from_policies`` sets decay ends as the module does: a cosine schedule with neither ``decay_steps`` nor
    ``max_steps`` is the module's error, at set-up (not a crash inside the first step)."""
    from types import SimpleNamespace

    spec = PolicySpec(name="a", model="tiny:gpt2-bpe", optimizer=OptimizerSpec(schedule="cosine"))
    model = torch.nn.Linear(1, 1)
    policy = SimpleNamespace(name="a", spec=spec, model=model, parameters=model.parameters)
    with pytest.raises(ValueError, match=r"policy 'a'.*decay_steps.*max_steps"):
        StepContext.from_policies([policy])
    ctx = StepContext.from_policies([policy], max_steps=10)
    assert ctx.decay_ends == {"a": 10}
