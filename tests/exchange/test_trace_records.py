"""The module publishes one SEE trace record per crossed response that carries an aligned trace (PRP
``peer_aligned``); the records are stored with the step's traffic and read back by the replay code. Importing the
package changes no global warning filter (the module applies its filters in ``setup``)."""

from __future__ import annotations

import subprocess
import sys

import lightning.pytorch as pl
import pytest
import torch

from mutual_rl.exchange import ExperienceExchange, StoredPeer, TraceRecord, read_step
from mutual_rl.exchange.records import groups_from_records
from mutual_rl.module import MutualRLModule
from mutual_rl.regimes import get_regime
from mutual_rl.update.config import GRPOConfig
from tests.module.helpers import datamodule, pair, trainer


def _fit(tmp_path, args):
    pl.seed_everything(0)
    m = MutualRLModule(pair(), algorithm=GRPOConfig(num_mini_batches=1), regime=get_regime("prp", **args),
                       reward="test_parity", log_samples_every_n_steps=0, thl_residual_every_n_steps=0)
    ex = ExperienceExchange(store_dir=str(tmp_path / "traffic"))
    trainer(tmp_path, max_steps=1, callbacks=[ex]).fit(m, datamodule=datamodule())
    return m, read_step(tmp_path / "traffic", 0)


def test_peer_aligned_traces_are_stored_and_read_back(tmp_path):
    m, stored = _fit(tmp_path, {"denominator": "peer_aligned"})
    groups = {(g.policy_id, g.prompt_id, g.group_id): g for g in groups_from_records(stored.records)}
    traces = [r for r in stored.records if isinstance(r, TraceRecord)]
    n_rollouts = sum(len(g.rollouts) for g in groups.values())
    assert len(traces) == n_rollouts and stored.header["counts"]["trace"] == n_rollouts  # every peer response
    for t in traces:
        assert t.receiver_id != t.policy_id and t.step == 0
        src = groups[(t.policy_id, t.prompt_id, t.group_id)].rollouts[t.index]
        receiver = m.policies[t.receiver_id]
        body = receiver.tokenizer(src.response_text, add_special_tokens=False)["input_ids"]
        assert len(t.source_logp) == len(body) + (src.finish_reason == "eos")  # one value per receiver token
        if len(t.source_logp):  # the alignment preserves the trace's mass
            assert float(t.source_logp.double().sum()) == pytest.approx(float(src.logp.double().sum()), abs=1e-4)
    peer = StoredPeer(tmp_path / "traffic", "gpt2")
    got, want = peer.traces(0), [t for t in traces if t.policy_id == "gpt2"]
    assert [(t.prompt_id, t.group_id, t.index, t.receiver_id) for t in got] == [
        (t.prompt_id, t.group_id, t.index, t.receiver_id) for t in want] and want
    assert all(torch.equal(a.source_logp, b.source_logp) for a, b in zip(got, want))
    assert {t.receiver_id for t in got} == {"llama"}


def test_learner_snapshot_stores_no_traces(tmp_path):
    _, stored = _fit(tmp_path, {})
    assert stored.header["counts"]["trace"] == 0


@pytest.mark.slow
def test_importing_the_package_changes_no_warning_filter():
    # third-party packages add filters of their own at import: import them first, then compare
    code = ("import warnings, torch, lightning.pytorch, transformers, jsonargparse; before = list(warnings.filters); "
            "import mutual_rl.module, mutual_rl.cli; "
            "assert list(warnings.filters) == before, [f for f in warnings.filters if f not in before]")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


def test_warning_filters_are_idempotent_and_silence_their_messages():
    import warnings

    from mutual_rl.warnings_filters import INAPPLICABLE_WARNINGS, ignore_inapplicable_warnings

    with warnings.catch_warnings():
        ignore_inapplicable_warnings()
        ignore_inapplicable_warnings()  # idempotent
        msgs = [f[1].pattern for f in warnings.filters if f[0] == "ignore" and f[1] is not None]
        assert all(msgs.count(m) == 1 for m in INAPPLICABLE_WARNINGS)
        warnings.simplefilter("error", UserWarning)
        ignore_inapplicable_warnings()
        warnings.warn("Your `IterableDataset` has `__len__` defined. ...", UserWarning, stacklevel=1)  # ignored
