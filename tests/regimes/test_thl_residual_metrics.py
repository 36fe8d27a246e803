"""The THL residual that the trainer logs per direction: aligned peer trace vs the receiver's own log-probs."""

from __future__ import annotations

import pytest
import torch

from mutual_rl.regimes.crossing import cross_rollouts, receiver_prompt_ids, thl_residual
from mutual_rl.step.scoring import receiver_logp
from tests.regimes.scenario import FakeReceiver, make_group


@pytest.mark.parametrize("source_logp,expected", [(-0.5, 0.0), (-0.4, 0.1)])
def test_residual_is_zero_for_identical_tokenizers_and_matching_traces(source_logp, expected):
    recv = FakeReceiver("r", logp_fn=lambda ids, w: torch.full((ids.shape[0], w), -0.5))
    own = [make_group("r", 0, [1, 0])]
    peer = make_group("s", 0, [1, 0], logps=[[source_logp] * 3] * 2)  # "46"/"47" + EOS, same char tokenizer
    crossed = cross_rollouts(recv, peer.rollouts, receiver_prompt_ids(own))
    m = thl_residual(crossed, receiver_logp(recv, crossed), granularity="span")
    assert set(m) == {f"thl/s->r/{k}" for k in ("residual_mean", "residual_p90", "residual_max",
                                                   "group_count_mismatch")}
    assert m["thl/s->r/residual_mean"] == pytest.approx(expected, abs=1e-6)
    assert m["thl/s->r/residual_max"] == pytest.approx(expected, abs=1e-6)
    assert m["thl/s->r/group_count_mismatch"] == 0.0


def test_residual_across_tokenizers_is_reported_per_source():
    recv = FakeReceiver("r", logp_fn=lambda ids, w: torch.full((ids.shape[0], w), -1.0))
    own = [make_group("r", 0, [1, 0], problem="1+2=")]
    bpe = make_group("s", 0, [1], kind="bpe", texts=["123 456"], problem="1+2=")
    char = make_group("t", 0, [1], texts=["7"], logps=[[-1.0, -1.0]], problem="1+2=")
    crossed = cross_rollouts(recv, [*bpe.rollouts, *char.rollouts], receiver_prompt_ids(own))
    m = thl_residual(crossed, receiver_logp(recv, crossed))
    assert m["thl/t->r/residual_mean"] == pytest.approx(0.0, abs=1e-6)  # same tokenizer, same trace
    assert m["thl/s->r/residual_mean"] > 0.0  # BPE pieces' mass spread over characters: -0.5·k/|T_g| != -1
    assert 0.0 <= m["thl/s->r/group_count_mismatch"] <= 1.0
    assert thl_residual([], receiver_logp(recv, [])) == {}
