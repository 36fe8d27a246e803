"""Hand-built scored groups (small tensors, no models) and a model-free Lightning fit for the exchange tests."""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader

from mutual_rl.types import Rollout, ScoredGroup


def make_group(policy: str, prompt_id: int, group_id: int, n: int = 3, step: int = 0, version: int = 0,
               seed: int = 0) -> ScoredGroup:
    """A group of ``n`` rollouts with awkward float32 log-probs (<= 0, as sampled log-probs are) and texts
    (newline, unicode); the offsets tile each text, as the engines' do."""
    gen = torch.Generator().manual_seed(seed * 1000 + prompt_id * 10 + group_id)
    rollouts = []
    for i in range(n):
        t = 2 + i
        text = ("ab\n" + "é" * i + "\ud800")[: t + 1]
        logp = -torch.randn(t, generator=gen, dtype=torch.float32).abs() * 3 - 1e-7
        rollouts.append(Rollout(
            policy_id=policy, prompt_id=prompt_id, group_id=group_id, step=step, policy_version=version,
            prompt_text=f"{prompt_id}+1=", response_text=text,
            prompt_ids=torch.arange(4, dtype=torch.long) + prompt_id,
            response_ids=torch.randint(0, 50000, (t,), generator=gen, dtype=torch.long),
            logp=logp, offsets=tuple((j, j + 1) for j in range(t - 1)) + ((t - 1, len(text)),),
            finish_reason="eos" if i % 2 == 0 else "length",
        ))
    rewards = (torch.arange(n) % 2).to(torch.float32)
    adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6) if n > 1 else torch.zeros(1)
    return ScoredGroup(policy, prompt_id, group_id, tuple(rollouts), rewards, adv.to(torch.float32))


def assert_groups_equal(a: ScoredGroup, b: ScoredGroup) -> None:
    """Exact equality, tensors included (values, dtype, shape)."""
    assert (a.policy_id, a.prompt_id, a.group_id) == (b.policy_id, b.prompt_id, b.group_id)
    for t, u in ((a.rewards, b.rewards), (a.advantages, b.advantages)):
        assert t.dtype == u.dtype and t.shape == u.shape and torch.equal(t, u)
    assert len(a.rollouts) == len(b.rollouts)
    for r, s in zip(a.rollouts, b.rollouts):
        for f in r.__dataclass_fields__:
            x, y = getattr(r, f), getattr(s, f)
            if isinstance(x, torch.Tensor):
                assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), f
            else:
                assert x == y, f


class ExchangeModule(LightningModule):
    """A model-free module that drives the exchange like the real one: each step policies ``a`` and ``b`` publish
    a group for the batch's prompt, each receiver consumes one response per delivered group and drops the rest."""

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


def fit_exchange(root, exchange, max_steps: int, ckpt=None, callbacks=()) -> Trainer:
    """Fit :class:`ExchangeModule` with ``exchange`` (and ``callbacks``) for ``max_steps`` (resuming from ``ckpt``
    if given)."""
    exchange.subscribe("a", {"rollout"})
    exchange.subscribe("b", {"reward"})
    trainer = Trainer(max_steps=max_steps, callbacks=[exchange, *callbacks], default_root_dir=root, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                      enable_checkpointing=False)
    trainer.fit(ExchangeModule(exchange), DataLoader(torch.arange(100)), ckpt_path=ckpt)
    return trainer
