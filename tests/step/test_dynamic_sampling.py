"""DAPO dynamic sampling (``algorithm.dynamic_sampling``, ``step/dynamic.py``) in a real tiny Trainer.

A group reward that depends only on the prompt makes the zero-variance groups deterministic: a prompt in the test's
rule gets ``[1, 0, ..., 0]`` (mixed, whatever was sampled), any other ``[0, ..., 0]`` (all-fail). So every count
(rounds, extra prompts and rollouts, kept / dropped / surplus groups) is derived by hand from the batch, and the
extra prompts are checked against the documented draw.
"""

from __future__ import annotations

import dataclasses

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from mutual_rl.callbacks import ResourceAllocation
from mutual_rl.interfaces import RolloutEngine
from mutual_rl.module import MutualRLModule
from mutual_rl.rewards import register_reward
from mutual_rl.rewards.base import available_rewards
from mutual_rl.step.dynamic import EXTRA_GROUP_IDS, extra_group_id_base, extra_prompts, has_variance
from mutual_rl.update.config import GRPOConfig
from tests.module.helpers import RecordMetrics, datamodule, pair, spec, trainer

MIXED: dict[str, set[str]] = {"texts": set()}  # problem texts whose groups get mixed rewards (the test's rule)

if "test_ds_by_prompt" not in available_rewards():

    @register_reward("test_ds_by_prompt")
    def _by_prompt(prompts, completions):
        """TRL-style, test only: [1, 0, ..., 0] for a prompt in MIXED["texts"], else all 0 (zero variance)."""
        n = len(completions)
        return [1.0] + [0.0] * (n - 1) if prompts[0] in MIXED["texts"] else [0.0] * n


class _Spy(RolloutEngine):
    """The HF engine, recording every generate call: (problems, group_id_base, response tokens)."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, policy, problems, sampling, *, step, group_id_base=0):
        out = self.engine.generate(policy, problems, sampling, step=step, group_id_base=group_id_base)
        self.calls.append((step, list(problems), group_id_base, sum(len(r.response_ids) for rs in out for r in rs)))
        return out


def _module(max_rounds: int, **kw) -> MutualRLModule:
    algo = GRPOConfig(num_mini_batches=2, dynamic_sampling=True, dynamic_sampling_max_rounds=max_rounds)
    m = MutualRLModule([spec("gpt2", "tiny:gpt2-bpe")], algorithm=algo, reward="test_ds_by_prompt",
                       log_samples_every_n_steps=0, **kw)
    m.engine = _Spy(m.engine)
    m.planned = []  # the own groups of every plan

    regime = m.regimes["gpt2"]
    plan = regime.plan

    def recording(receiver, own, peers, k, scores=None):
        m.planned.append(list(own))
        return plan(receiver, own, peers, k, scores)

    regime.plan = recording
    return m


def _snapshot(m):
    return {k: v.detach().clone() for k, v in m.named_parameters() if v.requires_grad}


def _ds(row: dict) -> dict[str, float]:
    return {k.split("/")[-1]: v for k, v in row.items() if k.startswith("gpt2/dynamic_sampling/")}


@pytest.mark.slow
def test_fills_the_batch_with_mixed_groups_and_counts_every_extra_rollout(tmp_path):
    pl.seed_everything(0)
    dm = datamodule(batch_size=4)
    b0, b1 = dm.train_batch(0), dm.train_batch(1)
    MIXED["texts"] = {p.problem for p in dm.train_problems() if p.prompt_id not in {q.prompt_id for q in b0[:2]}}
    assert not {p.problem for p in b0[:2]} & MIXED["texts"]  # the rule: b0[0], b0[1] all-fail, every other mixed
    m = _module(max_rounds=3)
    trainer(tmp_path, max_steps=0).fit(m, datamodule=dm)  # builds the policy
    before = _snapshot(m)
    rec, alloc = RecordMetrics(), ResourceAllocation()
    trainer(tmp_path, max_steps=2, callbacks=[alloc, rec]).fit(m, datamodule=dm)
    # step 0: b0[0], b0[1] dropped; one extra round of 4 prompts (all mixed): 2 kept, 2 cut
    assert _ds(rec.rows[0]) == {"rounds": 1.0, "extra_prompts": 4.0, "extra_rollouts": 16.0, "kept_groups": 4.0,
                                "dropped_groups": 2.0, "surplus_groups": 2.0, "limit_hit": 0.0}
    # step 1: every prompt of batch 1 mixed, nothing extra
    assert _ds(rec.rows[1]) == {"rounds": 0.0, "extra_prompts": 0.0, "extra_rollouts": 0.0, "kept_groups": 4.0,
                                "dropped_groups": 0.0, "surplus_groups": 0.0, "limit_hit": 0.0}
    calls = m.engine.calls
    assert [(s, len(ps), base) for s, ps, base, _ in calls] == [
        (0, 4, 0), (0, 4, extra_group_id_base(0, 0, 1, 1, 3, 4)), (1, 4, 4)]
    extra = calls[1][1]
    assert extra == extra_prompts(dm.train_problems(), 4, seed=dm.seed, step=0, round=1,
                                  exclude={p.prompt_id for p in b0})  # the documented draw
    # the plans hold exactly batch_size groups, all mixed, with unique (prompt_id, group_id)
    assert [len(p) for p in m.planned] == [4, 4]
    assert [(g.prompt_id, g.group_id) for g in m.planned[0]] == [
        (b0[2].prompt_id, 2), (b0[3].prompt_id, 3), (extra[0].prompt_id, EXTRA_GROUP_IDS),
        (extra[1].prompt_id, EXTRA_GROUP_IDS + 1)]
    assert [(g.prompt_id, g.group_id) for g in m.planned[1]] == [(p.prompt_id, 4 + i) for i, p in enumerate(b1)]
    assert all(has_variance(g) for plan in m.planned for g in plan)
    # generated tokens: every round, in the step metrics and in the MWRA totals
    tokens = [sum(t for s, *_, t in calls if s == step) for step in (0, 1)]
    assert [r["gpt2/generated_tokens"] for r in rec.rows] == tokens
    assert alloc.accounting.totals["gpt2"].generated_tokens == sum(tokens)
    assert rec.rows[0]["gpt2/gen_tokens_per_s"] == pytest.approx(tokens[0] / rec.rows[0]["gpt2/gen_s"], rel=1e-5)
    after = _snapshot(m)
    assert [k for k in before if torch.equal(before[k], after[k])] == []


@pytest.mark.slow
def test_max_rounds_stop_and_are_logged_then_the_steps_own_groups_train(tmp_path):
    pl.seed_everything(0)
    dm = datamodule(batch_size=4)
    b0, b1 = dm.train_batch(0), dm.train_batch(1)
    MIXED["texts"] = {b0[0].problem}  # only b0[0] is ever mixed
    m = _module(max_rounds=2)
    rec = RecordMetrics()
    trainer(tmp_path, max_steps=2, callbacks=[rec]).fit(m, datamodule=dm)
    drawn = [p.problem for s, ps, base, _ in m.engine.calls if base >= EXTRA_GROUP_IDS for p in ps]
    assert len(drawn) == 2 * 2 * 4 and b0[0].problem not in drawn
    # step 0: 1 mixed group of round 0, two fruitless extra rounds of 4 prompts: it trains on that one group
    assert _ds(rec.rows[0]) == {"rounds": 2.0, "extra_prompts": 8.0, "extra_rollouts": 32.0, "kept_groups": 1.0,
                                "dropped_groups": 11.0, "surplus_groups": 0.0, "limit_hit": 1.0}
    assert [(g.prompt_id, g.group_id) for g in m.planned[0]] == [(b0[0].prompt_id, 0)]
    assert rec.rows[0]["gpt2/trained_tokens"] > 0
    # step 1: nothing mixed: it falls back to its own (zero-advantage) groups and trains nothing
    assert _ds(rec.rows[1]) == {"rounds": 2.0, "extra_prompts": 8.0, "extra_rollouts": 32.0, "kept_groups": 0.0,
                                "dropped_groups": 12.0, "surplus_groups": 0.0, "limit_hit": 1.0}
    assert [(g.prompt_id, g.group_id) for g in m.planned[1]] == [(p.prompt_id, 4 + i) for i, p in enumerate(b1)]
    assert all(float(g.advantages.abs().max()) == 0.0 for g in m.planned[1])
    assert rec.rows[1]["gpt2/trained_tokens"] == 0.0


@pytest.mark.slow
def test_filter_only_and_off(tmp_path):
    pl.seed_everything(0)
    dm = datamodule(batch_size=4)
    b0 = dm.train_batch(0)
    MIXED["texts"] = {b0[1].problem, b0[3].problem}
    m = _module(max_rounds=0)  # filter only
    rec = RecordMetrics()
    trainer(tmp_path, max_steps=1, callbacks=[rec]).fit(m, datamodule=dm)
    assert len(m.engine.calls) == 1 and [g.group_id for g in m.planned[0]] == [1, 3]
    assert _ds(rec.rows[0])["limit_hit"] == 1.0 and _ds(rec.rows[0])["kept_groups"] == 2.0
    off = MutualRLModule([spec("gpt2", "tiny:gpt2-bpe")], algorithm=GRPOConfig(num_mini_batches=2),
                         reward="test_ds_by_prompt", log_samples_every_n_steps=0)
    rec = RecordMetrics()
    trainer(tmp_path, max_steps=1, callbacks=[rec]).fit(off, datamodule=datamodule(batch_size=4))
    assert not _ds(rec.rows[0]) and rec.rows[0]["gpt2/generated_tokens"] > 0


@pytest.mark.slow
def test_extra_prompts_are_deterministic_and_resume_exactly(tmp_path):
    dm = datamodule(batch_size=4)
    pool = dm.train_problems()
    a = extra_prompts(pool, 4, seed=0, step=3, round=1, exclude={pool[0].prompt_id})
    assert a == extra_prompts(pool, 4, seed=0, step=3, round=1, exclude={pool[0].prompt_id})
    assert pool[0] not in a and len({p.prompt_id for p in a}) == 4
    for other in (dict(seed=1, step=3, round=1), dict(seed=0, step=4, round=1), dict(seed=0, step=3, round=2),
                  dict(seed=0, step=3, round=1, rank=1)):
        assert extra_prompts(pool, 4, **other) != a, other
    small = pool[:3]  # fewer unused problems than asked: topped up with replacement from all of them
    got = extra_prompts(small, 5, seed=0, step=0, round=1, exclude={small[0].prompt_id})
    assert len(got) == 5 and set(got[:2]) == set(small[1:]) and set(got) <= set(small)

    # a run resumed at step 1 draws the same extra prompts as the uninterrupted run (step 1 needs one extra round)
    b1 = dm.train_batch(1)
    MIXED["texts"] = {p.problem for p in pool if p.prompt_id != b1[0].prompt_id}

    def extras(m):
        return [(s, [p.prompt_id for p in ps], base) for s, ps, base, _ in m.engine.calls if base >= EXTRA_GROUP_IDS]

    pl.seed_everything(0)
    full = _module(max_rounds=3)
    trainer(tmp_path / "full", max_steps=2).fit(full, datamodule=datamodule(batch_size=4))
    assert [s for s, *_ in extras(full)] == [1]
    pl.seed_everything(0)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    trainer(tmp_path / "a", max_steps=1, callbacks=[ckpt], enable_checkpointing=True).fit(
        _module(max_rounds=3), datamodule=datamodule(batch_size=4))
    pl.seed_everything(123)
    resumed = _module(max_rounds=3)
    trainer(tmp_path / "b", max_steps=2, enable_checkpointing=True).fit(
        resumed, datamodule=datamodule(batch_size=4), ckpt_path=next((tmp_path / "ckpt").glob("*step=1*.ckpt")))
    assert extras(resumed) == extras(full)
    planned = [[(g.prompt_id, g.group_id) for g in plan] for plan in (full.planned[1], resumed.planned[0])]
    assert planned[0] == planned[1]


def test_sharing_regimes_and_groups_of_one_are_refused():
    algo = GRPOConfig(dynamic_sampling=True)
    with pytest.raises(ValueError, match=r"model.algorithm.dynamic_sampling.*sgt.*model.regime: none"):
        MutualRLModule(pair(), algorithm=algo, regime="sgt", reward="test_parity")
    own = pair()
    own[1] = dataclasses.replace(own[1], regime="graft")
    with pytest.raises(ValueError, match=r"receivers \['llama'\].*model.regime: none"):
        MutualRLModule(own, algorithm=algo, regime="none", reward="test_parity")
    with pytest.warns(UserWarning):
        single = [spec("gpt2", "tiny:gpt2-bpe", n=1)]
    with pytest.raises(ValueError, match=r"sampling.n >= 2"):
        MutualRLModule(single, algorithm=algo, reward="test_parity")
    with pytest.raises(ValueError, match="dynamic_sampling_max_rounds"):
        GRPOConfig(dynamic_sampling=True, dynamic_sampling_max_rounds=-1)
    MutualRLModule(pair(), algorithm=algo, regime="none", reward="test_parity")  # no sharing: fine
