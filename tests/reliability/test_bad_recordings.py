"""Recorded exchange traffic (``ExperienceExchange(store_dir=)``, replayed with ``replay_dir=``) is never lost and
never trusted blindly: a second run refused before it overwrites a first run's recording, a resumed run keeping its
own, a replay run refused when it would write where it reads, and every stored record cross-checked on reading
(one error naming the file, the line and the record)."""

from __future__ import annotations

import json
import math
import re
import shutil
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from mutual_rl.exchange import ExperienceExchange, StoredPeer, StoredTrafficError
from mutual_rl.exchange.store import StoreInUseError, step_path
from mutual_rl.model.spec import PolicySpec, SamplingSpec, WarmStart
from mutual_rl.module import MutualRLModule
from mutual_rl.update.config import GRPOConfig
from tests.exchange.helpers import fit_exchange
from tests.module.helpers import datamodule, trainer
from tests.reliability import one_glance


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _real_run(root: Path, store: Path) -> None:
    """Two tiny policies (a byte-level BPE and a char tokenizer) train 2 steps and record their traffic."""
    specs = [PolicySpec(name=n, model=m, warmstart=WarmStart(steps=0), sampling=SamplingSpec(n=2, max_new_tokens=6))
             for n, m in (("gpt2", "tiny:gpt2-bpe"), ("llama", "tiny:llama-char"))]
    pl.seed_everything(0)
    m = MutualRLModule(specs, algorithm=GRPOConfig(num_mini_batches=1), regime="sgt", reward="test_parity",
                       log_samples_every_n_steps=0)
    trainer(root, max_steps=2, callbacks=[ExperienceExchange(store_dir=str(store))]).fit(
        m, datamodule=datamodule(batch_size=2))


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    """A real recording (2 steps, 2 policies); tests copy it before touching it."""
    root = tmp_path_factory.mktemp("recording")
    _real_run(root / "run", root / "traffic")
    return root / "traffic"


@pytest.fixture
def copy(recording, tmp_path) -> Path:
    dest = tmp_path / "traffic"
    shutil.copytree(recording, dest)
    return dest


def _run_ids(store: Path) -> set:
    return {json.loads(p.read_text().split("\n")[0]).get("run_id") for p in store.glob("step-*.jsonl")}


# ------------------------------------------------------------------------ 1. a used store_dir is refused
def test_a_second_run_into_a_used_store_dir_is_refused_and_the_first_recording_kept(copy, tmp_path):
    before = _files(copy)
    (first,) = _run_ids(copy)
    with one_glance.raises(StoreInUseError) as err:
        _real_run(tmp_path / "second", copy)
    msg = str(err.value)
    assert f"store_dir {copy} already holds the recording of run {first}: steps 0..1 (2 files)" in msg
    assert "would overwrite that run's steps" in msg and f"store_dir: {copy}-2" in msg and "--ckpt_path" in msg
    assert _files(copy) == before  # byte-identical, nothing added


def test_a_recording_from_before_run_ids_is_refused_too(tmp_path):
    store = tmp_path / "traffic"
    fit_exchange(tmp_path / "a", ExperienceExchange(store_dir=str(store)), 3)
    for p in store.glob("step-*.jsonl"):  # as mutual-rl wrote them before run ids
        lines = p.read_text().split("\n")
        header = json.loads(lines[0])
        del header["run_id"]
        p.write_text("\n".join([json.dumps(header)] + lines[1:]))
    before = _files(store)
    with one_glance.raises(StoreInUseError, match=rf"store_dir {re.escape(str(store))} already holds the recording of a "
                                              r"run that wrote no run id .*steps 0\.\.2 \(3 files\)"):
        fit_exchange(tmp_path / "b", ExperienceExchange(store_dir=str(store)), 3)
    assert _files(store) == before


# ------------------------------------------------------------------------ 2. a resumed run keeps its own recording
def test_a_resumed_run_continues_its_own_recording(tmp_path):
    store = tmp_path / "traffic"
    first = ExperienceExchange(store_dir=str(store))
    fit_exchange(tmp_path / "a", first, 3).save_checkpoint(tmp_path / "c3.ckpt")
    kept = _files(store)
    resumed = ExperienceExchange(store_dir=str(store))  # a new process: a new callback, its id from the checkpoint
    fit_exchange(tmp_path / "a", resumed, 5, ckpt=str(tmp_path / "c3.ckpt"))
    assert resumed.run_id == first.run_id
    assert sorted(p.name for p in store.iterdir()) == [f"step-{s:06d}.jsonl" for s in range(5)]
    assert {k: v for k, v in _files(store).items() if k in kept} == kept  # steps 0..2 untouched
    assert _run_ids(store) == {first.run_id}
    assert [len(StoredPeer(store, "a").groups(s)) for s in range(5)] == [1] * 5  # one recording, all replayable


def test_steps_recorded_after_the_resumed_checkpoint_are_set_aside_not_overwritten(tmp_path):
    store = tmp_path / "traffic"
    fit_exchange(tmp_path / "a", ExperienceExchange(store_dir=str(store)), 3).save_checkpoint(tmp_path / "c3.ckpt")
    fit_exchange(tmp_path / "a", ExperienceExchange(store_dir=str(store)), 5, ckpt=str(tmp_path / "c3.ckpt"))
    later = {k: v for k, v in _files(store).items() if k in ("step-000003.jsonl", "step-000004.jsonl")}
    with pytest.warns(UserWarning, match=rf"store_dir {re.escape(str(store))}: steps 3\.\.4 were recorded after the "
                                         r"checkpoint this run resumes from \(step 3\); moved to .*superseded-from-step"):
        fit_exchange(tmp_path / "a", ExperienceExchange(store_dir=str(store)), 6, ckpt=str(tmp_path / "c3.ckpt"))
    aside = store / "superseded-from-step-000003"
    assert _files(aside) == later  # the earlier attempt's steps 3..4, byte-identical
    assert sorted(p.name for p in store.glob("step-*.jsonl")) == [f"step-{s:06d}.jsonl" for s in range(6)]
    assert StoredPeer(store, "a").steps() == list(range(6))


def test_resuming_another_runs_checkpoint_into_a_used_store_dir_is_refused(tmp_path):
    a = ExperienceExchange(store_dir=str(tmp_path / "a"))
    fit_exchange(tmp_path / "ra", a, 2).save_checkpoint(tmp_path / "a.ckpt")
    b = ExperienceExchange(store_dir=str(tmp_path / "b"))
    fit_exchange(tmp_path / "rb", b, 4)
    before = _files(tmp_path / "b")
    with one_glance.raises(StoreInUseError) as err:
        fit_exchange(tmp_path / "ra", ExperienceExchange(store_dir=str(tmp_path / "b")), 4, ckpt=str(tmp_path / "a.ckpt"))
    msg = str(err.value)
    assert f"store_dir {tmp_path / 'b'} already holds the recording of run {b.run_id}: steps 0..3 (4 files)" in msg
    assert f"this run (run {a.run_id}, resumed from its checkpoint)" in msg
    assert _files(tmp_path / "b") == before


def test_a_run_resumed_from_a_checkpoint_before_run_ids_adopts_its_id_less_recording(tmp_path):
    store = tmp_path / "traffic"
    fit_exchange(tmp_path / "a", ExperienceExchange(store_dir=str(store)), 3).save_checkpoint(tmp_path / "c3.ckpt")
    for p in store.glob("step-*.jsonl"):
        lines = p.read_text().split("\n")
        header = json.loads(lines[0])
        del header["run_id"]
        p.write_text("\n".join([json.dumps(header)] + lines[1:]))
    ckpt = torch.load(tmp_path / "c3.ckpt", weights_only=False)
    (key,) = [k for k in ckpt["callbacks"] if "ExperienceExchange" in k]
    del ckpt["callbacks"][key]["run_id"]
    torch.save(ckpt, tmp_path / "legacy.ckpt")
    kept = _files(store)
    with pytest.warns(UserWarning, match=r"its steps 0\.\.2 \(3 files\) carry no run id .* taken to be this run's recording"):
        fit_exchange(tmp_path / "a", ExperienceExchange(store_dir=str(store)), 5, ckpt=str(tmp_path / "legacy.ckpt"))
    assert {k: v for k, v in _files(store).items() if k in kept} == kept
    assert StoredPeer(store, "a").steps() == list(range(5))


# ------------------------------------------------------------------------ 3. replay never writes where it reads
@pytest.mark.parametrize("layout", ["same", "symlink", "store_inside_replay", "replay_inside_store"])
def test_a_replay_run_never_writes_where_it_reads(copy, tmp_path, layout):
    before = _files(copy)
    if layout == "same":
        store, replay = copy, copy
    elif layout == "symlink":
        (tmp_path / "link").symlink_to(copy)
        store, replay = tmp_path / "link", copy
    elif layout == "store_inside_replay":
        store, replay = copy / "replayed", copy
    else:
        inner = tmp_path / "all" / "rec"
        shutil.copytree(copy, inner)
        before = _files(inner)
        store, replay = tmp_path / "all", inner
    with one_glance.raises(ValueError) as err:
        ExperienceExchange(store_dir=str(store), replay_dir=str(replay), replay_policies=["gpt2"])
    msg = str(err.value)
    assert f"store_dir {str(store)!r} and replay_dir {str(replay)!r}" in msg
    assert {"same": "are the same folder (", "symlink": "are the same folder once symlinks are resolved",
            "store_inside_replay": "store_dir (", "replay_inside_store": "replay_dir ("}[layout] in msg
    assert "would write its own step files over the recording it reads" in msg and "-replay" in msg
    assert _files(replay) == before


# ------------------------------------------------------------------------ 4. stored records are cross-checked
def _first_rollout(path: Path) -> tuple[int, dict]:
    """(line number, record) of the first rollout with at least 3 tokens and 3 characters."""
    for i, line in enumerate(path.read_text().split("\n")[1:-1], start=2):
        d = json.loads(line)
        if d["kind"] == "rollout" and len(d["response_ids"]["data"]) >= 3 and len(d["response_text"]) >= 3:
            return i, d
    raise AssertionError("no rollout to edit")


def _first(path: Path, kind: str) -> tuple[int, dict]:
    for i, line in enumerate(path.read_text().split("\n")[1:-1], start=2):
        d = json.loads(line)
        if d["kind"] == kind:
            return i, d
    raise AssertionError(f"no {kind} record")


def _swap_text(d):  # same length, other characters: only the digest can tell
    d["response_text"] = "".join("7" if c != "7" else "8" for c in d["response_text"])


def _longer_text(d):
    d["response_text"] += "9"


def _longer_text_no_digest(d):  # a record written before digests: the offsets still tell
    d["response_text"] += "9"
    del d["digest"]


def _short_logp(d):
    d["logp"]["data"].pop()
    d["logp"]["shape"] = [len(d["logp"]["data"])]


def _nan_logp(d):
    d["logp"]["data"][1] = math.nan


def _positive_logp(d):
    d["logp"]["data"][0] = 0.5


def _span_past_text(d):
    d["offsets"][-1][1] = len(d["response_text"]) + 4


def _negative_id(d):
    d["response_ids"]["data"][0] = -3


def _nan_value(d):
    d["value"] = math.nan


def _inf_value(d):
    d["value"] = math.inf


EDITS = [  # (kind edited, edit, what the message must say)
    ("rollout", _swap_text, r"the record differs from what was recorded \(its digest does not match its fields\)"),
    ("rollout", _longer_text, r"the offsets end at character \d+ but response_text has \d+ characters"),
    ("rollout", _longer_text_no_digest, r"the offsets end at character \d+ but response_text has \d+ characters"),
    ("rollout", _short_logp, r"logp has \d+ values but response_ids has \d+ tokens"),
    ("rollout", _nan_logp, r"logp\[1\] = nan: a log-prob must be finite and <= 0"),
    ("rollout", _positive_logp, r"logp\[0\] = 0\.5: a log-prob must be finite and <= 0"),
    ("rollout", _span_past_text, r"offsets\[\d+\] = \[\d+, \d+\]: spans must be \[start, end\] pairs in response_text "
                                 r"\(\d+ characters\), in order and without overlap"),
    ("rollout", _negative_id, r"response_ids\[0\] = -3 is not a token id"),
    ("reward", _nan_value, r"value nan is not a finite number: a stored reward must be finite"),
    ("advantage", _inf_value, r"value inf is not a finite number: a stored advantage must be finite"),
]


@pytest.mark.parametrize(("kind", "edit", "says"), EDITS, ids=[e[1].__name__.strip("_") for e in EDITS])
def test_a_hand_edited_record_is_refused_naming_file_line_and_record(copy, kind, edit, says):
    path = step_path(copy, 1)
    lines = path.read_text().split("\n")
    i, d = _first_rollout(path) if kind == "rollout" else _first(path, kind)
    edit(d)
    lines[i - 1] = json.dumps(d)
    path.write_text("\n".join(lines))
    where = rf"{re.escape(str(path))}:{i}: {kind} record \(policy '{d['policy_id']}', prompt {d['prompt_id']}, " \
            rf"group {d['group_id']}(, response {d.get('index')})?\): "
    with one_glance.raises(StoredTrafficError, match=where + says):
        StoredPeer(copy, d["policy_id"]).groups(1)
    assert StoredPeer(copy, d["policy_id"]).groups(0)  # the step left alone still replays


def test_the_unedited_recording_replays(recording):
    for policy in ("gpt2", "llama"):
        assert [len(StoredPeer(recording, policy).groups(s)) for s in (0, 1)] == [2, 2]


def test_a_folder_mixing_two_runs_recordings_is_refused_at_replay(tmp_path):
    """What reusing a store_dir used to leave: the second run's steps 0..1 over the first run's 0..3."""
    fit_exchange(tmp_path / "a", ExperienceExchange(store_dir=str(tmp_path / "a_traffic")), 4)
    fit_exchange(tmp_path / "b", ExperienceExchange(store_dir=str(tmp_path / "b_traffic")), 2)
    for s in (0, 1):
        shutil.copy(step_path(tmp_path / "b_traffic", s), step_path(tmp_path / "a_traffic", s))
    (b_id,) = _run_ids(tmp_path / "b_traffic")
    peer = StoredPeer(tmp_path / "a_traffic", "a")
    assert peer.groups(0)
    with one_glance.raises(StoredTrafficError) as err:
        peer.groups(2)
    msg = str(err.value)
    assert f"{step_path(tmp_path / 'a_traffic', 2)} was recorded by run " in msg
    assert f"but {step_path(tmp_path / 'a_traffic', 0)} by run {b_id}" in msg and "mixes two runs' recordings" in msg


def test_no_warning_for_an_ordinary_recording(tmp_path):
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="store_dir")
        fit_exchange(tmp_path / "a", ExperienceExchange(store_dir=str(tmp_path / "t")), 2)


def test_the_comparison_sets_aside_a_recording_whose_attempt_left_no_checkpoint(tmp_path, monkeypatch):
    """``mutual-rl compare`` restarts a run without ``last.ckpt`` from scratch: a new run, so the earlier attempt's
    steps are moved (kept) out of its way; a run with ``last.ckpt`` resumes and keeps its recording."""
    from types import SimpleNamespace

    from mutual_rl.compare import runner
    from mutual_rl.compare.settings import Settings
    from mutual_rl.config_files import load_config

    cmds = []
    monkeypatch.setattr(runner, "start_fit", lambda cmd, log, threads=None: cmds.append(cmd) or SimpleNamespace())
    traffic = tmp_path / "runs" / "grpo-s0" / "traffic"
    fit_exchange(tmp_path / "a", ExperienceExchange(store_dir=str(traffic)), 2)
    earlier = _files(traffic)
    settings = Settings(smoke=True, read_config=load_config)
    runner.launch(runner.Job("grpo", 0), settings, tmp_path)
    assert "--ckpt_path" not in cmds[-1]
    assert list(traffic.glob("step-*.jsonl")) == []
    assert _files(traffic / "superseded-from-step-000000") == earlier
    fit_exchange(tmp_path / "b", ExperienceExchange(store_dir=str(traffic)), 2)  # the new attempt records
    (traffic.parent / "ckpt").mkdir()
    (traffic.parent / "ckpt" / "last.ckpt").write_bytes(b"x")
    kept = _files(traffic)
    runner.launch(runner.Job("grpo", 0), settings, tmp_path)
    assert "--ckpt_path" in cmds[-1] and _files(traffic) == kept
