"""``self/approx_kl``: the k3 KL of the current policy to the receiver's behaviour policy on its *own* rows, logged
by every objective (DAPO, PRPTruncatedIS, HACPOObjective, FTISObjective), so it compares across regimes; ``approx_kl`` is kept (all rows: for PRP
``peer_aligned`` its peer tokens are measured against the aligned peer trace)."""

from __future__ import annotations

import pytest
import torch

from mutual_rl.algorithms import kl_penalty, masked_mean
from mutual_rl.regimes.hacpo import HACPO
from mutual_rl.types import PolicyBatch
from mutual_rl.update.config import GRPOConfig
from mutual_rl.update.objectives import FTISObjective, Norms, PRPTruncatedIS, resolve

OLD = torch.tensor([[-1.0, -2.0], [-0.5, -0.7], [-9.0, -8.0], [-7.0, -6.0]])  # rows 2, 3: peer (far-off trace)
LOGP = torch.tensor([[-1.1, -1.8], [-0.4, -0.9], [-0.3, -0.2], [-0.5, -0.6]])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
PEER = torch.tensor([False, False, True, True])


def batch(is_peer, extras=None):
    n = len(is_peer)
    return PolicyBatch(input_ids=torch.zeros(n, 4, dtype=torch.long), attention_mask=torch.ones(n, 4, dtype=torch.long),
                       response_mask=MASK[:n], old_logp=OLD[:n], advantages=torch.tensor([1.0, -1.0, 1.0, -1.0])[:n],
                       weights=torch.ones(n), is_peer=is_peer, prompt_ids=list(range(n)), **(extras or {}))


def run(objective, sub):
    _, m = resolve(objective, GRPOConfig().dapo()).loss(LOGP[: len(sub)].clone(), sub, Norms(None, None, 2))
    return m.metrics()  # the logged names: approx_kl (all rows), self/approx_kl, peer/approx_kl


def k3(rows):
    return float(masked_mean(kl_penalty(OLD[rows], LOGP[rows], "k3"), MASK[rows]))


def test_dapo_without_peers_self_equals_all_rows():
    m = run(None, batch(torch.tensor([False, False])))  # None: DAPO
    assert m["self/approx_kl"] == m["approx_kl"] == pytest.approx(k3([0, 1]))


@pytest.mark.parametrize("name,objective,extras", [
    ("dapo", None, None),
    ("prp_tis", PRPTruncatedIS(is_cap=2.0), None),
    ("hacpo", HACPO().objective,  # L_m 0.8 (the first update)
     {"source_mean_logp": torch.tensor([0.0, 0.0, -8.5, -7.0]), "cap_ratio": torch.ones(4)}),
    ("ftis", FTISObjective(is_cap=2.0), {"gen_logp": OLD - 0.5}),  # old_logp: π_R,old of peer rows
])
def test_self_approx_kl_is_own_rows_only(name, objective, extras):
    m = run(objective, batch(PEER, extras))
    assert m["self/approx_kl"] == pytest.approx(k3([0, 1]), rel=1e-6)
    assert m["self/approx_kl"] < 0.1 < k3([2, 3])  # the peer trace is far off: all-rows approx_kl would show it
    if name != "hacpo":  # hacpo has no all-rows approx_kl (peer rows carry no token-level behaviour log-probs)
        assert m["approx_kl"] == pytest.approx(k3([0, 1, 2, 3]), rel=1e-6)
        assert m["peer/approx_kl"] == pytest.approx(k3([2, 3]), rel=1e-6)
