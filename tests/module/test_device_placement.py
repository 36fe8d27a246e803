"""Device placement: real training steps with every policy on a simulated second device (tests/device_check.py).

Lightning itself places the module on the simulated device (``SingleDeviceStrategy(device=SIM)``), as it places it
on a GPU, and the whole fit runs inside :class:`SimulatedDevice`: any op that mixes a tensor on the policy's device
with a non-scalar tensor left on the host raises, as CUDA would. Between them the fits cover every regime (PRP in
both modes), KL with a frozen reference copy (moved to the device when first used) and with LoRA, three and four
policies, shared-prompt prefill (groups of one prompt), micro-batches, held-out evaluation (sampled and greedy),
the THL residual, SGT's NLL term and dynamic sampling.

The training reward is scripted (:class:`ScriptedReward`) so that every path that crosses peer responses has rows
to cross on any machine; each such path is asserted from the logged metrics.
"""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import SingleDeviceStrategy

from mutual_rl.data.datamodule import PromptDataModule
from mutual_rl.data.task import ArithmeticTask
from mutual_rl.evaluation.validation import EvalConfig
from mutual_rl.model.policy import build_policy
from mutual_rl.module import MutualRLModule
from mutual_rl.regimes import get_regime
from mutual_rl.rewards.combined import GroupScore, Reward
from mutual_rl.update.config import GRPOConfig
from tests.device_check import DEVICE, SIM, SimulatedDevice, tag_of
from tests.module.helpers import TASK, RecordMetrics, spec, trainer

pytestmark = pytest.mark.slow  # Lightning fits of every regime


class ScriptedReward(Reward):
    """The training reward: in a group of the policy at position ``rank`` of ``order``, the first response
    succeeds iff ``prompt_id + rank`` is even, every other response fails. So every policy has mixed and all-fail
    groups, and on each all-fail group of a policy some peer of the other parity has a success: SGT rescues it,
    GRAFT finds a candidate in both directions, dynamic sampling drops and refills."""

    def __init__(self, order: list[str]):  # no terms: score_group is the whole reward
        self.order, self.terms, self.log_terms, self.__name__ = order, [], False, "scripted"

    def score_group(self, problem, completions, *, where=""):
        rank = next(i for i, name in enumerate(self.order) if f"policy {name!r}" in where)  # as scoring.py names it
        ok = (problem.prompt_id + rank) % 2 == 0
        return GroupScore([float(ok and i == 0) for i in range(len(completions))], {})


class OnDevice(Callback):
    """Puts in the scripted reward, checks that Lightning placed every policy on SIM, and keeps each policy's
    trainable parameters as they were before the first step."""

    def __init__(self):
        self.before: dict[str, list[torch.Tensor]] = {}

    def on_train_start(self, trainer, pl_module):
        pl_module.reward_fn = ScriptedReward([s.name for s in pl_module.specs])
        for name, policy in pl_module.policies.items():
            assert policy.device == SIM and all(p.device == SIM for p in policy.parameters()), name
            self.before[name] = [p.detach().clone() for p in policy.parameters() if p.requires_grad]


@pytest.fixture(scope="module", autouse=True)
def presets():
    """Build the presets outside the mode (the fits then load them from the cache)."""
    for model in ("tiny:gpt2-bpe", "tiny:llama-char"):
        build_policy(spec("p", model), task=ArithmeticTask(**TASK))


def _fit(tmp_path, specs, *, regime="none", evaluation=None, **algo):
    """One training step inside the mode; returns the logged rows and the metrics at the end (validation's)."""
    pl.seed_everything(0)
    m = MutualRLModule(specs, algorithm=GRPOConfig(**{"num_mini_batches": 2, "micro_batch_size": 2, **algo}),
                       regime=regime, reward="test_parity", evaluation=evaluation or EvalConfig(),
                       log_samples_every_n_steps=0, eval_at_start=False, thl_residual_every_n_steps=1)
    rec, check = RecordMetrics(), OnDevice()
    val = dict(limit_val_batches=1, val_check_interval=1) if evaluation else {}
    t = trainer(tmp_path, max_steps=1, callbacks=[rec, check], accelerator="cpu",
                strategy=SingleDeviceStrategy(device=SIM), **val)
    dm = PromptDataModule(task=ArithmeticTask(**TASK), batch_size=4, val_batch_size=4, val_per_skill=2)
    with SimulatedDevice():
        t.fit(m, datamodule=dm)
    for name, policy in m.policies.items():  # every policy really trained
        after = [p.detach() for p in policy.parameters() if p.requires_grad]
        assert any(not torch.equal(a, b) for a, b in zip(check.before[name], after)), name
        for ref in policy._reference or []:  # a KL reference copy (no LoRA) followed the policy to the device
            assert all(tag_of(p) == DEVICE for p in ref.parameters()), name
    metrics = {k: float(v) for k, v in t.callback_metrics.items()}
    return rec.rows, metrics


def test_no_sharing_dynamic_sampling_kl_lora_evaluation(tmp_path):
    specs = [spec("gpt2", "tiny:gpt2-bpe", lora=True, n=2), spec("llama", "tiny:llama-char", n=2)]
    rows, last = _fit(tmp_path, specs, kl_coef=0.01, dynamic_sampling=True, dynamic_sampling_max_rounds=2,
                      evaluation=EvalConfig(k=2, max_new_tokens=3))
    for name in ("gpt2", "llama"):
        assert rows[0][f"{name}/dynamic_sampling/dropped_groups"] > 0  # the scripted all-fail groups
        assert rows[0][f"{name}/dynamic_sampling/kept_groups"] > 0
        assert f"{name}/kl" in rows[0]
        assert {f"{name}/val/pass@1", f"{name}/val/greedy"} <= set(last)  # sampled and greedy evaluation ran


def test_sgt_graft_prp_aligned_three_policies(tmp_path):
    specs = [spec("gpt2", "tiny:gpt2-bpe", n=2), spec("llama", "tiny:llama-char", n=2),
             spec("llama2", "tiny:llama-char", lora=True, n=2)]
    specs[0].regime = get_regime("sgt", coef=0.5)
    specs[1].regime = get_regime("graft", delta=0.0)
    specs[2].regime = get_regime("prp", denominator="peer_aligned")
    rows, _ = _fit(tmp_path, specs, regime="sgt", kl_coef=0.01)
    row = rows[0]
    assert row["gpt2/rescued"] > 0 and "gpt2/nll" in row  # SGT's NLL term on crossed rows
    assert row["llama/transferred_responses"] > 0  # GRAFT's receiver forward and grafted rows
    assert row["llama2/prp/peer_rows"] > 0
    for receiver in ("gpt2", "llama", "llama2"):
        assert any(k.startswith("thl/") and k.endswith(f"->{receiver}/residual_mean") for k in row), receiver


def test_hacpo_ftis_prp_xgrpo_four_policies(tmp_path):
    specs = [spec("gpt2", "tiny:gpt2-bpe", lora=True, n=2), spec("llama", "tiny:llama-char", n=2),
             spec("llama2", "tiny:llama-char", n=2), spec("gpt2b", "tiny:gpt2-bpe", n=2)]
    for s, regime in zip(specs, ("hacpo", "ftis", "prp", "xgrpo")):
        s.regime = get_regime(regime)
    rows, _ = _fit(tmp_path, specs, regime="prp", kl_coef=0.01)
    row = rows[0]
    assert row["gpt2/peer_responses"] > 0
    assert row["llama/ftis/peer_rows"] > 0
    assert row["llama2/prp/peer_rows"] > 0  # learner_snapshot: the peer rows' old log-probs recomputed
    assert row["gpt2b/xgrpo/pooled_frac"] > 0
