"""Token-budget micro-batches (update/packing.py): the packing itself by hand, and log-probs and gradients equal to
the unbatched path (one full-width forward per mini-batch) within 1e-6 + 1e-6·|value| in float32 (a forward on
fewer columns moves log-probs of magnitude ~10 by about one float32 ulp, up to 9.5e-7), for budgets from one row per
micro-batch to all rows, on rows of mixed prompt and response lengths, with the KL reference, old log-probs
recomputed and an NLL term. Shared prompt forwards are off here (a one-row micro-batch has nothing to share, and the
shared-prompt forward differs from the plain one by float rounding up to 1e-5: tests/model/test_shared_prompts.py)."""

from __future__ import annotations

import sys

import pytest
import torch

import mutual_rl.update.loop as loop
from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.policy import build_policy
from mutual_rl.regimes.base import split_rows
from mutual_rl.rollout.hf import HFRolloutEngine
from mutual_rl.types import NLLTerm, Problem, TrainingPlan, collate
from mutual_rl.update.config import GRPOConfig
from mutual_rl.update.packing import DEFAULT_TOKEN_BUDGET, cost, lengths, narrow, pack, token_budget
from tests.module.helpers import TASK, spec


def test_pack_by_hand():
    prompt, response = [3, 5, 2, 4], [4, 1, 6, 2]  # row lengths 7, 6, 8, 6
    assert cost([0, 2], prompt, response) == 2 * (3 + 6)
    assert pack([0, 1, 2, 3], prompt, response, budget=1) == [[2], [0], [1], [3]]  # longest first, one each
    # 8 alone; 7 joins it? 2 x (3 + 6) = 18 > 16: no; 7 + 6 (row 1): 2 x (5 + 4) = 18 > 16: no ...
    assert pack([0, 1, 2, 3], prompt, response, budget=16) == [[2], [0], [1, 3]]  # rows 1, 3: 2 x (5 + 2) = 14
    assert pack([0, 1, 2, 3], prompt, response, budget=10**6) == [[0, 1, 2, 3]]  # original order inside
    # longest first: 2, 0, then 1 before 3 (a tie: original order); three rows, then the fourth
    assert pack([0, 1, 2, 3], prompt, response, budget=10**6, max_rows=3) == [[0, 1, 2], [3]]
    assert pack([], prompt, response, budget=5) == []
    with pytest.raises(ValueError, match="token budget"):
        pack([0], prompt, response, budget=0)


def test_token_budget_sources():
    class P:
        token_budget = None

    p = P()
    assert token_budget(p, "auto") == DEFAULT_TOKEN_BUDGET and token_budget(p, 64) == 64
    p.token_budget = 123  # the memory plan's
    assert token_budget(p, "auto") == 123 and token_budget(p, 64) == 64


@pytest.fixture(scope="module", params=["tiny:gpt2-bpe", "tiny:llama-char"])
def setup(request):
    task = ArithmeticTask(**TASK)
    policy = build_policy(spec("p", request.param), task=task, needs_reference=True)
    policy.share_prompts = False
    torch.manual_seed(0)
    problems = [Problem(i, text, "0", "add") for i, text in enumerate(["3+4=", "12+34=", "99-9=", "5-2=", "1+23=",
                                                                       "45+67+8="])]
    groups = HFRolloutEngine().generate(policy, problems, policy.spec.sampling, step=0)
    rollouts = [r for g in groups for r in g]
    adv = torch.tensor([0.0] * 4 + [1.0, -1.0, 0.5, -0.5] * 5)
    batch = collate(rollouts, adv, policy.tokenizer.pad_token_id)
    with torch.no_grad():  # the reference differs from the policy, so the KL term has a gradient
        for q in policy.parameters():
            q.add_(torch.randn_like(q) * 1e-2)
    prompt, response = lengths(batch)
    assert len(set(prompt)) > 1 and len(set(response)) > 1  # mixed lengths
    return policy, batch


def _budgets(batch) -> list[int]:
    prompt, response = lengths(batch)
    rows = list(range(len(batch)))
    one = max(p + t for p, t in zip(prompt, response))
    return [1, one, 2 * one + 1, cost(rows, prompt, response) // 2, cost(rows, prompt, response)]


def test_packed_old_logp_equal_the_full_forward(setup):
    policy, batch = setup
    rows = list(range(len(batch)))
    with torch.no_grad():
        full, _ = policy.response_logp(batch.input_ids, batch.attention_mask, batch.response_width, 1.0)
    full = full * batch.response_mask
    for budget in _budgets(batch):
        b = batch.select(rows)
        b.old_logp.zero_()
        loop.recompute_old_logp(policy, b, rows, 1.0, 0, budget)
        torch.testing.assert_close(b.old_logp, full, rtol=1e-6, atol=1e-6, msg=f"budget {budget}")
    assert narrow(batch.select([0])).input_ids.shape[1] < batch.input_ids.shape[1]  # a row alone is cut narrower


def _grads(policy, batch, budget, monkeypatch, unbatched=False):
    """Gradients of each mini-batch's optimizer step (captured, not taken), and the update's stats."""
    if unbatched:  # the path before packing: one full-width forward per mini-batch
        monkeypatch.setattr(loop, "narrow", lambda b, size=None: b)
    params = [p for p in policy.parameters() if p.requires_grad]
    captured = []
    nll = NLLTerm(batch.select([4, 9, 13]), [[0, 2], [1]], coef=0.5)
    plan = TrainingPlan(batch.select(list(range(len(batch)))), split_rows(len(batch), 2), nll=nll)
    cfg = GRPOConfig(max_tokens_per_micro_batch=budget, kl_coef=0.1, old_logp="recompute")
    stats = loop.update_policy(policy, plan, cfg, backward=lambda loss: loss.backward(),
                               step_optimizer=lambda: captured.append([p.grad.detach().clone() for p in params]),
                               zero_grad=lambda: [setattr(p, "grad", None) for p in params])
    monkeypatch.undo()
    return captured, stats


def test_packed_update_gives_the_unbatched_gradients(setup, monkeypatch):
    policy, batch = setup
    want, want_stats = _grads(policy, batch, 10**9, monkeypatch, unbatched=True)
    assert len(want) == 2 and all(any(float(g.abs().max()) > 1e-4 for g in step) for step in want)
    for budget in _budgets(batch):
        got, stats = _grads(policy, batch, budget, monkeypatch)
        for step_got, step_want in zip(got, want, strict=True):
            for g, w in zip(step_got, step_want, strict=True):
                torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6, msg=f"budget {budget}")
        assert stats.loss == pytest.approx(want_stats.loss, abs=1e-6)
        assert stats.nll == pytest.approx(want_stats.nll, abs=1e-6)


_READS = ("item", "tolist", "__float__", "__bool__", "__int__", "__index__")


def _host_reads(policy, batch, budget, monkeypatch, updates: int = 2) -> tuple[int, int]:
    """Device-to-host reads made by the update's own code (update/, algorithms/, stats) during one step of
    ``updates`` mini-batches, and the forwards it ran."""
    counts = {"reads": 0, "forwards": 0}

    def counting(original):
        def read(self, *args, **kwargs):
            if sys._getframe(1).f_globals.get("__name__", "").startswith(
                    ("mutual_rl.update", "mutual_rl.algorithms", "mutual_rl.stats")):
                counts["reads"] += 1
            return original(self, *args, **kwargs)
        return read

    for name in _READS:
        monkeypatch.setattr(torch.Tensor, name, counting(getattr(torch.Tensor, name)))
    forward = policy.response_logp

    def counted(*args, **kwargs):
        counts["forwards"] += 1
        return forward(*args, **kwargs)

    monkeypatch.setattr(policy, "response_logp", counted)
    params = [p for p in policy.parameters() if p.requires_grad]
    nll = NLLTerm(batch.select([4, 9, 13]), [[0, 2], [1]] if updates == 2 else [[0], [1], [2], []], coef=0.5)
    plan = TrainingPlan(batch.select(list(range(len(batch)))), split_rows(len(batch), updates), nll=nll)
    cfg = GRPOConfig(max_tokens_per_micro_batch=budget, kl_coef=0.1, old_logp="recompute")
    loop.update_policy(policy, plan, cfg, backward=lambda loss: loss.backward(), step_optimizer=lambda: None,
                       zero_grad=lambda: [setattr(p, "grad", None) for p in params])
    monkeypatch.undo()
    return counts["reads"], counts["forwards"]


def test_one_host_read_per_update_however_many_micro_batches(setup, monkeypatch):
    """The update reads its device values (losses, token counts, statistics, the gradient norm) once per optimizer
    update, not once per micro-batch: one forward per row costs the same number of reads as one forward per
    mini-batch."""
    policy, batch = setup
    many_reads, many_forwards = _host_reads(policy, batch, 1, monkeypatch)
    few_reads, few_forwards = _host_reads(policy, batch, 10**9, monkeypatch)
    assert many_forwards > few_forwards + 2 * len(batch) - 8  # one row per forward (KL reference, recompute too)
    assert many_reads == few_reads
    more_updates, _ = _host_reads(policy, batch, 1, monkeypatch, updates=4)
    assert more_updates == many_reads + 2  # one read per optimizer update (the rest: the step's set-up)
