"""Crossed rows keep the log-prob sources apart (docs/design.md, rule 3): ``source_logp`` is the peer's THL-aligned
trace, ``old_logp`` the receiver-side behaviour log-probs a regime set (``None``: recomputed by the receiver), and
collate reads ``old_logp``. Aligned traces become SEE trace records."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mutual_rl.exchange import TraceRecord, trace_records
from mutual_rl.regimes import get_regime
from mutual_rl.regimes.crossing import cross_rollouts, receiver_prompt_ids
from mutual_rl.step.scoring import plan_regime
from mutual_rl.types import collate
from tests.regimes.scenario import FakeReceiver, make_group

TRACE = [-0.1, -0.3, -0.2, -0.4, -0.6, -0.8]  # bpe '1','2',' ','3','4',EOS of "12 34"


def scenario():
    recv = FakeReceiver("r")
    own = [make_group("r", 0, [0, 0])]
    peers = {"s": [make_group("s", 0, [1, 0], kind="bpe", texts=["12 34", "47"], logps=[TRACE, [-1.0, -2.0, -3.0]])]}
    return recv, own, peers


def test_cross_rollouts_sets_source_logp_and_leaves_old_logp_to_the_regime():
    recv, own, peers = scenario()
    rollouts = peers["s"][0].rollouts
    plain = cross_rollouts(recv, rollouts, receiver_prompt_ids(own))
    aligned = cross_rollouts(recv, rollouts, receiver_prompt_ids(own), granularity="word")
    for c in plain:
        assert not c.aligned and c.old_logp is None and c.source_logp.eq(0).all()
        assert len(c.source_logp) == len(c.response_ids)
    assert all(c.aligned and c.old_logp is None for c in aligned)
    torch.testing.assert_close(aligned[0].source_logp, torch.tensor([-0.2, -0.2, -0.5, -0.5, -0.5, -0.5]))
    # collate: a crossed row without old_logp is zeros and needs its old log-probs recomputed
    b = collate(aligned, torch.zeros(2), recv.tokenizer.pad_token_id)
    assert b.needs_old_logp.tolist() == [True, True] and b.old_logp.eq(0).all()


def test_collate_reads_old_logp_of_crossed_rows():
    recv, own, peers = scenario()
    (c,) = cross_rollouts(recv, peers["s"][0].rollouts[1:], receiver_prompt_ids(own), granularity="word")
    old = torch.tensor([-7.0, -8.0, -9.0])
    b = collate([own[0].rollouts[0], dataclasses.replace(c, old_logp=old)], torch.zeros(2),
                recv.tokenizer.pad_token_id)
    assert b.is_peer.tolist() == [False, True] and b.needs_old_logp.tolist() == [False, False]
    torch.testing.assert_close(b.old_logp[1, :3], old)  # old_logp, not the aligned source trace (-2.0 each)
    torch.testing.assert_close(b.old_logp[0, :3], own[0].rollouts[0].logp)  # own row: the sampler's trace


def test_prp_peer_aligned_sets_old_logp_to_the_aligned_trace_and_snapshot_leaves_it_none():
    recv, own, peers = scenario()
    plan = plan_regime(get_regime("prp", denominator="peer_aligned"), recv, own, peers, 1)
    for c in plan.crossed:
        assert c.aligned and c.old_logp is c.source_logp
    plan = plan_regime(get_regime("prp"), recv, own, peers, 1)
    assert all(not c.aligned and c.old_logp is None for c in plan.crossed)


def test_graft_sets_old_logp_to_the_receivers_log_probs():
    recv = FakeReceiver("r", logp_fn=lambda ids, w: torch.full((ids.shape[0], w), -0.25))
    own = [make_group("r", 0, [0, 0, 0, 0])]
    peers = {"s": [make_group("s", 0, [1, 0, 1, 0], logps=[[-0.25] * 3] * 4)]}
    plan = plan_regime(get_regime("graft", delta=0.0, balance=False), recv, own, peers, 1)
    rows = plan.batch.is_peer.nonzero().squeeze(-1).tolist()
    assert rows and not plan.batch.needs_old_logp.any()
    for i in rows:
        n = int(plan.batch.response_mask[i].sum())
        assert plan.batch.old_logp[i, :n].eq(-0.25).all()
    assert all(c.old_logp is None and not c.aligned for c in plan.crossed)  # plan.crossed: as crossed


def test_trace_records_one_per_aligned_response_with_its_index():
    recv, own, peers = scenario()
    group = peers["s"][0]
    crossed = cross_rollouts(recv, group.rollouts[::-1], receiver_prompt_ids(own), granularity="word")
    recs = trace_records(crossed, peers["s"])
    assert [type(r) for r in recs] == [TraceRecord, TraceRecord]
    assert [(r.policy_id, r.prompt_id, r.group_id, r.index, r.receiver_id) for r in recs] == [
        ("s", 0, 0, 1, "r"), ("s", 0, 0, 0, "r")]
    for r, c in zip(recs, crossed):
        assert r.source_logp is c.source_logp and r.step == c.source.step
        assert float(r.source_logp.sum()) == pytest.approx(float(c.source.logp.sum()), abs=1e-6)  # mass kept
    assert trace_records(cross_rollouts(recv, group.rollouts, receiver_prompt_ids(own)), peers["s"]) == []
    with pytest.raises(ValueError, match="in none of the given groups"):
        trace_records(crossed, [])
