"""Stored traffic (atomic, schema-versioned JSONL per step) and stored-peer replay, with clear errors."""

from __future__ import annotations

import json

import pytest
import torch

from mutual_rl.exchange import (
    SCHEMA_VERSION,
    ExchangeProtocolError,
    ExperienceExchange,
    ReplayMismatchError,
    StoredPeer,
    StoredTrafficError,
    TraceRecord,
    read_step,
    step_path,
    stored_steps,
)
from tests.exchange.helpers import assert_groups_equal, make_group

PROMPTS = {0: [11, 12, 13], 1: [21, 22, 23], 2: [31, 32, 33]}


def record_run(store_dir, steps=(0, 1, 2)):
    """A two-policy run that stores its traffic; returns what each policy published per step."""
    ex = ExperienceExchange(store_dir=str(store_dir))
    ex.subscribe("a", {"rollout", "reward", "advantage"})
    ex.subscribe("b", {"reward"})
    published = {}
    for step in steps:
        ex.begin_step(step)
        for i, p in enumerate(("a", "b")):
            published[step, p] = [make_group(p, q, 10 * q + i, n=2 + i, step=step, version=step) for q in PROMPTS[step]]
            for g in published[step, p]:
                ex.publish(g)
        ex.publish([TraceRecord("a", PROMPTS[step][0], 10 * PROMPTS[step][0], step, step, 0, "b",
                               torch.tensor([-0.1, -2.5]))])
        ex.report("a", "b", consumed=9)
        ex.report("b", "a", consumed=4, dropped={"gate_closed": 2})
        ex.end_step()
    return published


def test_store_writes_one_atomic_versioned_file_per_step(tmp_path):
    record_run(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000.jsonl", "step-000001.jsonl",
                                                          "step-000002.jsonl"]  # no temporary files left
    assert stored_steps(tmp_path) == [0, 1, 2]
    header = json.loads(step_path(tmp_path, 1).read_text().split("\n")[0])
    assert header["schema_version"] == SCHEMA_VERSION and header["step"] == 1
    assert header["record_kinds"] == ["rollout", "reward", "advantage", "trace"]
    assert header["counts"] == {"rollout": 15, "reward": 15, "advantage": 15, "trace": 1}
    assert header["flows"] == {"b->a": {"delivered": 9, "consumed": 9},
                               "a->b": {"delivered": 6, "consumed": 4, "dropped/gate_closed": 2}}
    trace = [r for r in read_step(tmp_path, 1).records if isinstance(r, TraceRecord)]
    assert trace[0].receiver_id == "b" and torch.equal(trace[0].source_logp, torch.tensor([-0.1, -2.5]))


def test_replay_returns_exactly_what_was_published(tmp_path):
    published = record_run(tmp_path)
    peer = StoredPeer(tmp_path, "b")
    assert peer.steps() == [0, 1, 2]
    for step in range(3):
        order = PROMPTS[step][::-1]  # returned in the receiver's batch order
        got = peer.groups(step, order)
        assert [g.prompt_id for g in got] == order
        for g, h in zip(got, published[step, "b"][::-1]):
            assert_groups_equal(g, h)  # float32 log-probs, rewards, advantages bit-identical
    assert [s for s, _ in peer] == [0, 1, 2]


def test_stored_traces_read_back_per_source_and_receiver(tmp_path):
    record_run(tmp_path)
    a = StoredPeer(tmp_path, "a")
    for step in range(3):
        (t,) = a.traces(step)
        assert (t.policy_id, t.prompt_id, t.step, t.index, t.receiver_id) == ("a", PROMPTS[step][0], step, 0, "b")
        assert torch.equal(t.source_logp, torch.tensor([-0.1, -2.5]))
        assert a.traces(step, receiver_id="b") == [t] and a.traces(step, receiver_id="a") == []
    assert StoredPeer(tmp_path, "b").traces(1) == []  # b's responses were never aligned onto a's tokens
    with pytest.raises(StoredTrafficError, match="missing stored exchange file"):
        a.traces(7)


def test_replay_mode_delivers_recorded_peer_as_if_co_trained(tmp_path):
    published = record_run(tmp_path / "rec")
    ex = ExperienceExchange(replay_dir=str(tmp_path / "rec"), replay_policies=["b"], store_dir=str(tmp_path / "new"))
    assert ex.replayed_policies == ["b"]
    ex.subscribe("a", {"rollout", "reward", "advantage"}, regime="graft")
    with pytest.raises(ValueError, match="is replayed"):
        ex.subscribe("b", {"reward"})
    for step in range(3):
        ex.begin_step(step)
        rep = ex.replay_groups(step, PROMPTS[step])
        assert ex.replay_groups(step, PROMPTS[step]).keys() == rep.keys()  # idempotent within a step
        for g in published[step, "a"]:
            ex.publish(g)
        with pytest.raises(ExchangeProtocolError, match="must not publish it"):
            ex.publish(published[step, "b"][0])
        d = ex.deliveries("a")
        assert list(d) == ["b"]
        for g, h in zip(d["b"], published[step, "b"]):
            assert_groups_equal(g, h)
        ex.report("a", "b", consumed=9)
        assert ex.end_step()["exchange/b->a/consumed"] == 9
    assert stored_steps(tmp_path / "new") == [0, 1, 2]


def test_prompt_mismatch_is_a_clear_error(tmp_path):
    record_run(tmp_path)
    with pytest.raises(ReplayMismatchError, match=r"stored peer 'b', step 1 .*same data \(data seed, batch size"):
        StoredPeer(tmp_path, "b").groups(1, [21, 22, 99])
    with pytest.raises(StoredTrafficError, match=r"no groups of policy 'zz' at step 0 \(policies in file: \['a', 'b'\]"):
        StoredPeer(tmp_path, "zz").groups(0)


def _lines(path):
    return path.read_text().split("\n")


def test_truncated_file_names_file_and_line(tmp_path):
    record_run(tmp_path)
    path = step_path(tmp_path, 1)
    text = path.read_text()
    path.write_text(text[: len(text) - 40])  # cut the last record mid-line
    n = len(_lines(path))
    with pytest.raises(StoredTrafficError, match=rf"step-000001\.jsonl:{n}: last line has no terminating newline"):
        StoredPeer(tmp_path, "b").groups(1)
    path.write_text("\n".join(text.split("\n")[:-3]) + "\n")  # cut at a line boundary: count check catches it
    with pytest.raises(StoredTrafficError, match=r"step-000001\.jsonl: header announces 46 records but the file holds 44"):
        read_step(tmp_path, 1)


def test_corrupt_line_names_file_and_line(tmp_path):
    record_run(tmp_path)
    path = step_path(tmp_path, 2)
    lines = _lines(path)
    lines[4] = lines[4][:30] + "}" + lines[4][30:]
    path.write_text("\n".join(lines))
    with pytest.raises(StoredTrafficError, match=r"step-000002\.jsonl:5: invalid JSON"):
        StoredPeer(tmp_path, "a").groups(2)
    lines = _lines(path)
    rec = json.loads(_lines(step_path(tmp_path, 0))[1])  # a rollout record
    del rec["logp"]
    lines[4] = json.dumps(rec)
    path.write_text("\n".join(lines))
    with pytest.raises(StoredTrafficError, match=r"step-000002\.jsonl:5: record is missing field 'logp'"):
        read_step(tmp_path, 2)


def test_wrong_schema_and_missing_step(tmp_path):
    record_run(tmp_path)
    path = step_path(tmp_path, 0)
    lines = _lines(path)
    header = json.loads(lines[0])
    header["schema_version"] = SCHEMA_VERSION + 1
    path.write_text("\n".join([json.dumps(header)] + lines[1:]))
    with pytest.raises(StoredTrafficError, match=rf"step-000000\.jsonl:1: schema_version {SCHEMA_VERSION + 1} is not"):
        StoredPeer(tmp_path, "b").groups(0)
    with pytest.raises(StoredTrafficError, match=r"missing stored exchange file .*step-000007\.jsonl for step 7; .* "
                                                 r"has steps 0\.\.2 \(3 files\)"):
        StoredPeer(tmp_path, "b").groups(7)
    with pytest.raises(StoredTrafficError, match="does not exist"):
        StoredPeer(tmp_path / "nope", "b")
    with pytest.raises(ValueError, match="needs both replay_dir and replay_policies"):
        ExperienceExchange(replay_dir=str(tmp_path))


def test_failed_write_leaves_no_partial_file(tmp_path, monkeypatch):
    import mutual_rl.exchange.store as store

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(store.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        record_run(tmp_path, steps=(0,))
    assert list(tmp_path.iterdir()) == []


def test_special_floats_and_dtypes_round_trip_through_the_store(tmp_path):
    import dataclasses

    g = make_group("a", 1, 1, n=2)
    r0 = dataclasses.replace(g.rollouts[0], logp=torch.tensor([-3.4028234663852886e38, -1e-45], dtype=torch.float32))
    r1 = dataclasses.replace(g.rollouts[1], logp=torch.tensor([-0.1, -3.3, -7.7], dtype=torch.bfloat16))
    g = dataclasses.replace(g, rollouts=(r0, r1), advantages=torch.tensor([0.1, -0.1], dtype=torch.float64))
    ex = ExperienceExchange(store_dir=str(tmp_path))
    ex.begin_step(3)
    ex.publish(g)
    ex.end_step()
    (h,) = StoredPeer(tmp_path, "a").groups(3, [1])
    assert_groups_equal(g, h)


def test_a_trace_is_checked_against_its_file_and_for_finite_values(tmp_path):
    record_run(tmp_path)
    path = step_path(tmp_path, 1)
    lines = _lines(path)
    i = next(k for k, line in enumerate(lines) if line.startswith('{"kind": "trace"'))
    d = json.loads(lines[i])
    who = r"trace record \(policy 'a', prompt 21, group 210, response 7, receiver 'b'\)"
    d["index"] = 7  # group 210 of policy a has 2 responses
    lines[i] = json.dumps(d)
    path.write_text("\n".join(lines))
    with pytest.raises(StoredTrafficError, match=rf"step-000001\.jsonl:{i + 1}: {who}: the trace is of response 7, "
                                                 r"but the file holds 2 rollout records of that group"):
        StoredPeer(tmp_path, "a").traces(1)
    d["index"], d["source_logp"]["data"][1] = 0, float("nan")
    lines[i] = json.dumps(d)
    path.write_text("\n".join(lines))
    with pytest.raises(StoredTrafficError, match=rf"step-000001\.jsonl:{i + 1}: {who.replace('7', '0')}: "
                                                 r"source_logp\[1\] = nan: a log-prob must be finite and <= 0"):
        read_step(tmp_path, 1)


def test_every_step_header_names_the_recording_run(tmp_path):
    ex = ExperienceExchange(store_dir=str(tmp_path))
    ex.subscribe("a", {"rollout"})
    for step in (0, 1):
        ex.begin_step(step)
        ex.publish(make_group("a", 1, step))
        ex.end_step()
    assert [read_step(tmp_path, s).run_id for s in (0, 1)] == [ex.run_id] * 2
    assert ex.state_dict()["run_id"] == ex.run_id and len(ex.run_id) == 32
    other = ExperienceExchange(store_dir=str(tmp_path))
    other.begin_step(0)
    other.publish(make_group("a", 1, 0))
    with pytest.raises(StoredTrafficError, match=rf"already holds the recording of run {ex.run_id}: steps 0\.\.1"):
        other.end_step()  # without a trainer the first end_step checks the folder
    assert [read_step(tmp_path, s).run_id for s in (0, 1)] == [ex.run_id] * 2
