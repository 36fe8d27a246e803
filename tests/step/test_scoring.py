"""What regimes request before they plan, computed by the step in one place (step/scoring.py).

- The receiver's log-probs of crossed peer text, in forwards packed to a token budget, equal one forward per row
  within 1e-6 + 1e-6·|value| in float32 (a forward on other shapes moves float32 log-probs by about one ulp), for
  budgets from one row per forward to every row at once, on real tiny policies of both presets scoring the other
  preset's text (mixed prompt and response lengths); no forward exceeds the budget unless it holds one row.
- Regimes run no model and join no collective: GRAFT, F-TIS and HACPO plan from the answers with a receiver whose
  model refuses every forward, and a plan without the answers is one clear error naming ``plan_regime``.
- HACPO's request: the counts by hand, and the plan observing them into its capability windows.
"""

from __future__ import annotations

import pytest
import torch

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.policy import build_policy
from mutual_rl.regimes import get_regime
from mutual_rl.regimes.crossing import cross_rollouts
from mutual_rl.rollout.hf import HFRolloutEngine
from mutual_rl.step.scoring import answer, plan_regime, receiver_logp
from mutual_rl.types import Problem, ScoringRequest, collate
from mutual_rl.update.packing import cost, lengths
from tests.module.helpers import TASK, spec
from tests.regimes.scenario import FakeReceiver, make_group

PROBLEMS = ["3+4=", "12+34=", "99-9=", "5-2=", "1+23=", "45+67+8="]


@pytest.fixture(scope="module", params=[("tiny:gpt2-bpe", "tiny:llama-char"), ("tiny:llama-char", "tiny:gpt2-bpe")],
                ids=["gpt2<-llama", "llama<-gpt2"])
def crossed(request):
    """A receiver and the other preset's sampled responses crossed into its tokenization (six prompts x 4)."""
    task = ArithmeticTask(**TASK)
    receiver = build_policy(spec("r", request.param[0]), task=task)
    source = build_policy(spec("s", request.param[1]), task=task)
    receiver.share_prompts = False
    torch.manual_seed(0)
    problems = [Problem(i, text, "0", "add") for i, text in enumerate(PROBLEMS)]
    own = HFRolloutEngine().generate(receiver, problems, receiver.spec.sampling, step=0)
    peer = HFRolloutEngine().generate(source, problems, source.spec.sampling, step=0)
    prompt_ids = {g[0].prompt_id: g[0].prompt_ids for g in own}
    rows = cross_rollouts(receiver, [r for g in peer for r in g], prompt_ids)
    return receiver, rows


def _one_row_each(receiver, rows):
    out = []
    with torch.no_grad():
        for c in rows:
            b = collate([c], torch.zeros(1), receiver.tokenizer.pad_token_id)
            logp, _ = receiver.response_logp(b.input_ids, b.attention_mask, b.response_width,
                                             receiver.spec.sampling.temperature)
            out.append(logp[0, : len(c.response_ids)].float())
    return out


@pytest.mark.parametrize("budget", ["one_row", "middle", "all_rows"])
def test_packed_scoring_equals_one_forward_per_row(crossed, budget):
    receiver, rows = crossed
    batch = collate(rows, torch.zeros(len(rows)), receiver.tokenizer.pad_token_id)
    prompt, response = lengths(batch)
    assert len(set(response)) > 1 and len(set(prompt)) > 1  # mixed lengths
    tokens = {"one_row": 1, "middle": cost(list(range(len(rows))), prompt, response) // 3, "all_rows": 10**6}[budget]
    shapes = []
    original = receiver.response_logp

    def recording(ids, mask, width, temperature, **kw):
        shapes.append(tuple(ids.shape))
        return original(ids, mask, width, temperature, **kw)

    receiver.response_logp = recording
    try:
        got = receiver_logp(receiver, rows, tokens)
    finally:
        del receiver.response_logp
    expected = _one_row_each(receiver, rows)
    assert len(got) == len(rows)
    for g, e, c in zip(got, expected, rows):
        assert g.dtype == torch.float32 and g.device.type == "cpu" and g.shape == (len(c.response_ids),)
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
    want = {"one_row": len(rows), "all_rows": 1}.get(budget)
    if want is not None:
        assert len(shapes) == want
    else:
        assert 1 < len(shapes) < len(rows)
    assert all(n * w <= tokens or n == 1 for n, w in shapes)  # every forward within the budget (or one row)
    assert sum(n for n, _ in shapes) == len(rows)


def test_no_rows_no_forward():
    recv = FakeReceiver("r", logp_fn=lambda ids, w: pytest.fail("a forward with nothing to score"))
    assert receiver_logp(recv, []) == []
    assert answer(recv, ScoringRequest()).logp is None


class _Refusing(FakeReceiver):
    """A receiver whose model refuses to run after the request is answered."""

    refuse = False

    def response_logp(self, *args, **kwargs):
        if self.refuse:
            raise AssertionError("a regime ran the receiver's model inside plan")
        return super().response_logp(*args, **kwargs)


def _scenario():
    own = [make_group("r", 0, [0, 0]), make_group("r", 1, [1, 0])]
    peers = {"s": [make_group("s", 0, [1, 0], logps=[[-0.2] * 3] * 2), make_group("s", 1, [0, 0])]}
    return own, peers


@pytest.mark.parametrize("regime,args", [("graft", {"delta": 0.0, "balance": False}), ("ftis", {}),
                                         ("hacpo", {}), ("graft", {"update_rule": "hacpo", "balance": False}),
                                         ("graft", {"update_rule": "sgt", "balance": False})])
def test_regimes_plan_on_answers_without_the_model(regime, args):
    own, peers = _scenario()
    recv = _Refusing("r", logp_fn=lambda ids, w: torch.full((ids.shape[0], w), -0.3))
    reg = get_regime(regime, **args)
    scores = answer(recv, reg.request(recv, own, peers))
    recv.refuse = True
    plan = reg.plan(recv, own, peers, 2, scores)
    assert len(plan.batch) >= 4
    if regime in ("ftis",) or args.get("delta") == 0.0:  # the answers were used: peer rows carry them
        assert scores.logp and all(torch.equal(t, torch.full_like(t, -0.3)) for t in scores.logp)
        peer_rows = plan.batch.is_peer.nonzero().flatten().tolist()
        assert peer_rows and all(float(plan.batch.old_logp[i, 0]) == pytest.approx(-0.3) for i in peer_rows)
    with pytest.raises(TypeError, match=r"GRAFT|FTIS|HACPO.*plan_regime\(regime, receiver"):
        get_regime(regime, **args).plan(recv, own, peers, 2)  # without the answers


def test_hacpo_request_counts_and_windows_by_hand():
    own = [make_group("r", 0, [1, 0, 0, 0], step=3), make_group("r", 1, [1, 1, 0, 0], step=3)]
    peers = {"s": [make_group("s", 0, [1, 1, 1, 0], step=3)], "t": []}
    recv = FakeReceiver("r")
    reg = get_regime("hacpo")
    req = reg.request(recv, own, peers)
    assert req.rows is None
    assert req.sums == (3.0, 8.0, 3.0, 4.0, 0.0, 0.0) and req.maxes == (3, 3, -1) and req.state == ("r", "s", "t")
    plan = plan_regime(reg, recv, own, {"s": peers["s"]}, 2)  # t delivered nothing: no account
    assert reg.windows == {"r": [(3, 3 / 8)], "s": [(3, 3 / 4)]}
    assert plan.metrics.capability == {"r": pytest.approx(3 / 8), "s": pytest.approx(3 / 4)}


def test_graft_hacpo_rule_counts_successes_at_the_configured_threshold():
    """GRAFT's HACPO rule requests its capability counts at ``algorithm.success_threshold`` (set on the GRAFT regime),
    not at the rule's own default, from the first step on."""
    own = [make_group("r", 0, [0.3, 0.3]), make_group("r", 1, [1, 0.3])]
    peers = {"s": [make_group("s", 0, [0.7, 0.3]), make_group("s", 1, [0.3, 0.3])]}
    reg = get_regime("graft", update_rule="hacpo", balance=False)
    reg.success_threshold = 0.5
    req = reg.request(FakeReceiver("r"), own, peers)
    assert req.sums == (1.0, 4.0, 1.0, 4.0)  # rewards > 0.5: r has one (the 1), s one (the 0.7)
