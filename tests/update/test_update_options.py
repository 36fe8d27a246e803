"""The update under options that used to break it: HACPO late in a run, GRAFT's optimizer-step count, Dr.GRPO's
constant normaliser, non-finite values, and per-token metrics of a step that trained nothing."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.policy import build_policy
from mutual_rl.regimes import get_regime
from mutual_rl.regimes.hacpo import HACPO
from mutual_rl.rewards import register_reward
from mutual_rl.rewards.base import available_rewards
from mutual_rl.rollout.hf import HFRolloutEngine
from mutual_rl.stats import flatten
from mutual_rl.step.scoring import plan_regime
from mutual_rl.types import TrainingPlan, collate
from mutual_rl.update.config import GRPOConfig
from mutual_rl.update.loop import NonFiniteUpdateError, update_policy
from mutual_rl.update.objectives import Norms, resolve
from tests.module.helpers import TASK, RecordMetrics, datamodule, module, pair, spec, trainer
from tests.regimes.scenario import FakeReceiver, make_group
from tests.update.recording import Recording


@pytest.fixture(scope="module")
def policy():
    return build_policy(spec("r", "tiny:llama-char"), task=ArithmeticTask(**TASK))


def _run(policy, plan, cfg, record=None):
    """``update_policy`` with plain autograd; optimizer steps are counted (and their gradients recorded), not
    taken, so the policy stays as it was. Returns (metrics, number of optimizer steps)."""
    params = [p for p in policy.parameters() if p.requires_grad]
    steps = []

    def step():
        if record is not None:
            record.append([p.grad.detach().clone() for p in params])
        steps.append(1)

    def zero():
        for p in params:
            p.grad = None

    out = update_policy(policy, plan, cfg, backward=lambda loss: loss.backward(), step_optimizer=step,
                        zero_grad=zero)
    return out, len(steps)


# --------------------------------------------------------------------------------------------------- HACPO
def _hacpo_plan(m_before: int, schedule: str):
    """Receiver log-probs -0.5 per token, peer traces -0.4: every peer row has s = exp(-0.1) = 0.905."""
    reg = HACPO(lower_schedule=schedule)
    reg.load_state_dict({"windows": {}, "updates": {"r": m_before}})
    recv = FakeReceiver("r", logp_fn=lambda ids, w: torch.full((ids.shape[0], w), -0.5))
    own = [make_group("r", q, [1, 0, 0, 0]) for q in range(4)]
    peers = {"s": [make_group("s", q, [1, 1, 0, 0], kind="bpe", logps=[[-0.4] * 3] * 4,
                              texts=["46", "46", "47", "47"]) for q in range(4)]}
    return plan_regime(reg, recv, own, peers, 4)


@pytest.mark.parametrize("schedule,live", [("update", True), ("step", False)])
def test_hacpo_peer_rows_get_gradient_at_step_50(schedule, live):
    plan = _hacpo_plan(50, schedule)
    b = plan.batch
    assert b.is_peer.any() and (b.advantages[b.is_peer] != 0).all()
    for update_index in range(4):  # the four optimizer updates of step 50
        logp = torch.full(b.response_mask.shape, -0.5, requires_grad=True)
        loss, m = resolve(plan.objective, GRPOConfig().dapo()).loss(logp, b, Norms(None, len(b), 8),
                                                                    update_index=update_index)
        loss.backward()
        peer_grad = float(logp.grad[b.is_peer].abs().sum())
        # "update": L_m = 0.8 + 0.025 m with m the update within the step (< 0.905): the clip passes gradient;
        # "step": L_m = min(1, 0.8 + 0.025 * 50) = 1, clip(s, 1, 1) == 1 has none
        assert (peer_grad > 0) == live, (update_index, peer_grad)
        assert float(m.rows.L_m) == pytest.approx(0.8 + 0.025 * update_index if live else 1.0)


def test_update_passes_the_update_index_within_the_step(policy):
    recording = Recording()  # the base DAPO, recorded
    torch.manual_seed(0)
    problems = ArithmeticTask(**TASK).train_problems()[:4]
    rollouts = [r for g in HFRolloutEngine().generate(policy, problems, policy.spec.sampling, step=0) for r in g]
    batch = collate(rollouts, torch.tensor([1.0, -1.0] * (len(rollouts) // 2)), policy.tokenizer.pad_token_id)
    plan = TrainingPlan(batch, [list(range(i, i + 4)) for i in range(0, 16, 4)], objective=recording)
    _, n = _run(policy, plan, GRPOConfig(ppo_epochs=2, old_logp="rollout"))
    calls = [u for u, *_ in recording.calls]
    assert n == 8 and calls == list(range(8))  # counted across PPO epochs; the next step starts at 0 again
    recording.calls.clear()
    _run(policy, plan, GRPOConfig(old_logp="rollout"))
    assert [u for u, *_ in recording.calls] == [0, 1, 2, 3]


# --------------------------------------------------------------------------------------------------- GRAFT
@pytest.mark.parametrize("peer_last", ["in_batch", "none"])
def test_graft_optimizer_steps_do_not_depend_on_grafting(policy, peer_last):
    own = [make_group("r", 0, [0, 0, 0, 0]), make_group("r", 1, [1, 0, 0, 0]), make_group("r", 2, [0, 1, 1, 0]),
           make_group("r", 3, [1, 1, 0, 0])]
    peers = {"s": [make_group("s", 0, [1, 0, 0, 0], kind="bpe"), make_group("s", 1, [0, 0, 0, 0], kind="bpe"),
                   make_group("s", 2, [1, 1, 1, 1], kind="bpe"), make_group("s", 3, [1, 1, 1, 1], kind="bpe")]}
    cfg = GRPOConfig(num_mini_batches=2, old_logp="rollout")
    grafting = plan_regime(get_regime("graft", delta=0.0, peer_last=peer_last), policy, own, peers, 2)
    assert flatten(grafting.metrics)["transferred_responses"] == 4.0  # one whole group (prompt 0) grafted
    nothing = plan_regime(get_regime("graft", delta=1e9, peer_last=peer_last), policy, own, peers, 2)  # s <= δ: none
    assert flatten(nothing.metrics)["transferred_responses"] == 0.0
    _, n_graft = _run(policy, grafting, cfg)
    _, n_plain = _run(policy, nothing, cfg)
    assert n_plain == 2 and n_graft == 2
    assert [len(mb) for mb in grafting.mini_batches] == [8, 8]


# ----------------------------------------------------------------------------------------- Dr.GRPO normaliser
def test_seq_mean_token_sum_norm_is_a_constant(policy):
    """One long row in mini-batch 2 does not change mini-batch 1's gradient (constant max_len normaliser)."""
    base = [make_group("r", q, [1, 0, 0, 1], texts=["46", "4", "47", "4"]) for q in range(2)]
    long = [base[0], make_group("r", 1, [1, 0, 0, 1], texts=["46", "4", "4" * 12, "4"])]
    grads = []
    for groups in (base, long):
        rows = [r for g in groups for r in g.rollouts]
        batch = collate(rows, torch.cat([g.advantages for g in groups]), policy.tokenizer.pad_token_id)
        plan = TrainingPlan(batch, [[0, 1, 2, 3], [4, 5, 6, 7]])
        record = []
        _run(policy, plan, GRPOConfig(agg="seq-mean-token-sum-norm", old_logp="recompute"), record)
        grads.append(record[0])
    for a, b in zip(grads[0], grads[1]):  # float noise only (another padded width); a 3/13 scaling is far outside
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


# ------------------------------------------------------------------------------------------------ non-finite
def _plan_of(policy, n_groups: int = 2):
    groups = [make_group("r", q, [1, 0, 0, 1]) for q in range(n_groups)]
    rows = [r for g in groups for r in g.rollouts]
    batch = collate(rows, torch.cat([g.advantages for g in groups]), policy.tokenizer.pad_token_id)
    return TrainingPlan(batch, [list(range(4 * i, 4 * i + 4)) for i in range(n_groups)])


def test_non_finite_advantage_is_refused_before_any_forward(policy):
    plan = _plan_of(policy)
    plan.batch.advantages[5] = float("nan")
    before = [p.detach().clone() for p in policy.parameters()]
    with pytest.raises(NonFiniteUpdateError, match=r"policy 'r': non-finite advantage in rows \[5\].*reward"):
        _run(policy, plan, GRPOConfig(old_logp="rollout"))
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))


@pytest.mark.parametrize("on_nonfinite", ["raise", "skip"])
def test_non_finite_loss_refuses_the_step(policy, on_nonfinite):
    plan = _plan_of(policy)
    plan.batch.old_logp[4:, 0] = float("nan")  # mini-batch 2 has a NaN behaviour log-prob: NaN ratio and loss
    cfg = GRPOConfig(old_logp="rollout", on_nonfinite=on_nonfinite, skip_zero_advantage=False)
    if on_nonfinite == "raise":
        with pytest.raises(NonFiniteUpdateError, match=r"policy 'r': non-finite loss in optimizer update 1.*"
                                                       r"optimizer.lr = .*on_nonfinite: skip"):
            _run(policy, plan, cfg)
        return
    out, n = _run(policy, plan, cfg)
    assert n == 1 and out.nonfinite_skipped == 1.0  # mini-batch 1 stepped, mini-batch 2 was refused
    assert math.isfinite(out.loss) and math.isfinite(out.grad_norm)


def test_far_too_high_learning_rate_stops_with_a_named_error(tmp_path):
    """lr 1e8 used to write NaN into the weights and crash a step later inside sampling ("probability tensor
    contains inf"); now the update stops at the first non-finite loss, gradient or weight, naming the policy."""
    pl.seed_everything(0)
    m = module(pair(lr=1e8))
    with pytest.raises(NonFiniteUpdateError, match=r"policy '(gpt2|llama)'.*non-finite.*learning rate.*1e\+08"):
        trainer(tmp_path, max_steps=3).fit(m, datamodule=datamodule())
    assert all(bool(torch.isfinite(p).all()) for p in m.parameters())  # the refused step wrote nothing


if "test_parity_then_zero" not in available_rewards():
    _calls = {"n": 0}

    @register_reward("test_parity_then_zero")
    def _parity_then_zero(completion: str, answer: str) -> float:
        """Parity for the first step's 32 calls (2 policies x 4 prompts x 4 responses), then always 0."""
        _calls["n"] += 1
        return float(len(completion) % 2 == 0) if _calls["n"] <= 32 else 0.0


def test_step_without_trained_rows_logs_nan_not_the_last_value(tmp_path):
    _calls["n"] = 0
    pl.seed_everything(0)
    m = module(pair(), reward="test_parity_then_zero")
    rec = RecordMetrics()
    trainer(tmp_path, max_steps=2, callbacks=[rec]).fit(m, datamodule=datamodule())
    for name in ("gpt2", "llama"):
        first, second = rec.rows[0], rec.rows[1]
        assert math.isfinite(first[f"{name}/entropy"]) and math.isfinite(first[f"{name}/clip_frac_low"])
        assert second[f"{name}/trained_tokens"] == 0.0  # every group all-fail: nothing to train on
        for k in ("entropy", "approx_kl", "clip_frac_low", "clip_frac_high", "ratio_mean"):
            assert math.isnan(second[f"{name}/{k}"]), (name, k, second[f"{name}/{k}"])


def test_non_finite_advantage_in_skip_mode_trains_nothing_and_counts(policy):
    plan = _plan_of(policy)
    plan.batch.advantages[0] = float("inf")
    out, n = _run(policy, plan, GRPOConfig(old_logp="rollout", on_nonfinite="skip"))
    assert n == 0 and out.nonfinite_skipped == 2.0 and out.trained_tokens == 0.0
