"""Prompts that do not fit a policy's context, as a run meets them: one error at set-up, or (``prompt_overflow:
truncate``) training on the prompt's tail. Prompt and held-out files that cannot be read (garbage Parquet, a lone
UTF-16 surrogate) and held-out sets that would evaluate nothing: one error at load naming the file, the row or the
setting."""

from __future__ import annotations

import json
import re
import warnings

import pytest

from mutual_rl.data.datamodule import PromptDataModule
from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.spec import PolicySpec, SamplingSpec, WarmStart
from mutual_rl.module import MutualRLModule
from tests.module.helpers import trainer
from tests.reliability import one_glance


def _spec(name: str = "char", n: int = 2, max_new_tokens: int = 5) -> PolicySpec:
    return PolicySpec(name=name, model="tiny:llama-char", warmstart=WarmStart(steps=0),
                      sampling=SamplingSpec(n=n, max_new_tokens=max_new_tokens))


def _prompt_file(tmp_path, problems: list[str]):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps({"problem": p, "answer": "1"}) for p in problems) + "\n")
    return path


LONG = "1" * 300 + "+1="


def test_prompt_longer_than_the_context_fails_at_set_up(tmp_path, preset_cache):
    dm = PromptDataModule(train_files=[str(_prompt_file(tmp_path, ["1+1=", LONG, "2+3=", "4+4="]))], batch_size=2)
    m = MutualRLModule([_spec()], reward="test_parity", log_samples_every_n_steps=0)
    with one_glance.raises(ValueError) as err:
        trainer(tmp_path, max_steps=1).fit(m, datamodule=dm)
    msg = str(err.value)
    assert "policy 'char' (tiny:llama-char): 1 of 4 prompts do not fit its context length 256" in msg
    assert f"prompt {10**9 + 1} '1111" in msg  # file rows are numbered from 10**9
    assert "304 prompt tokens + 5 (sampling.max_new_tokens) = 309 > 256" in msg
    assert "model.prompt_overflow: truncate" in msg


@pytest.mark.slow
def test_truncate_mode_trains_on_the_prompt_tail(tmp_path, preset_cache):
    dm = PromptDataModule(train_files=[str(_prompt_file(tmp_path, ["1+1=", LONG]))], batch_size=2)
    gpt2 = PolicySpec(name="bpe", model="tiny:gpt2-bpe", warmstart=WarmStart(steps=0),
                      sampling=SamplingSpec(n=2, max_new_tokens=5))  # learned positions: 256 is a hard limit
    m = MutualRLModule([_spec(), gpt2], reward="test_parity", log_samples_every_n_steps=0,
                       prompt_overflow="truncate", eval_at_start=False)
    fit = trainer(tmp_path, max_steps=1)
    fit.fit(m, datamodule=dm)  # the batch holds the long prompt
    assert fit.global_step == 1
    assert m.prompts_truncated == {"char": 1, "bpe": 1}
    for policy in m.policies.values():
        assert len(policy.encode_prompt(policy.render_prompt(LONG))) == 256 - 5


# ------------------------------------------------------------------ prompt and held-out files that cannot be read
def _rows(path, rows: list[str]):
    path.write_text("\n".join(rows) + "\n")
    return path


OK_ROW = json.dumps({"problem": "1+1=", "answer": "2"})


@pytest.mark.parametrize("content", [b"garbage, not parquet at all", b"PAR1" + b"\0" * 64 + b"PAR1", b""])
def test_garbage_parquet_file_is_one_error_naming_the_file(tmp_path, content):
    pytest.importorskip("pyarrow")
    bad = tmp_path / "held.parquet"
    bad.write_bytes(content)
    dm = PromptDataModule(train_files=[str(_rows(tmp_path / "train.jsonl", [OK_ROW]))], val_files=[str(bad)])
    with one_glance.raises(ValueError) as err:
        dm.val_problems()
    msg = str(err.value)
    assert msg.startswith(f"{bad}: not a readable Parquet file (")  # was pyarrow's ArrowInvalid, raw
    assert "Give a Parquet file" in msg and ".jsonl file" in msg


def test_truncated_parquet_file_is_one_error_naming_the_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    good = tmp_path / "whole.parquet"
    pq.write_table(pa.table({"problem": [f"{i}+1=" for i in range(200)], "answer": [str(i + 1) for i in range(200)]}),
                   good)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with one_glance.raises(ValueError, match=rf"^{re.escape(str(cut))}: not a readable Parquet file .*copied completely"):
        PromptDataModule(train_files=[str(cut)]).train_problems()


@pytest.mark.parametrize(("value", "field", "where"), [
    ('{"problem": "1+\\ud800=", "answer": "2"}', "'problem'", "line 2"),  # high surrogate without its pair
    ('{"problem": "1+1=", "answer": "\\udc00"}', "'answer'", "line 2"),  # a low one alone
    ('{"problem": "1+1=", "answer": "2", "meta": {"tags": ["ok", "x\\uDBFF"]}}', "'meta.tags[1]'", "line 2"),
])
def test_lone_surrogate_in_a_prompt_file_is_named_at_load(tmp_path, value, field, where):
    """A lone UTF-16 surrogate is no character: it loaded, then failed raw when first encoded (tokenizer, logs)."""
    path = _rows(tmp_path / "prompts.jsonl", [OK_ROW, value])
    dm = PromptDataModule(train_files=[str(path)])
    with one_glance.raises(ValueError) as err:
        dm.train_problems()
    msg = str(err.value)
    assert msg.startswith(f"{path}: {where}: field {field} holds a lone UTF-16 surrogate")
    assert "surrogate pair" in msg
    assert "\\ud800" in msg or "\\udc00" in msg or "\\udbff" in msg


def test_lone_surrogate_in_a_json_array_names_the_row(tmp_path):
    path = tmp_path / "prompts.json"
    path.write_text('[{"problem": "1+1=", "answer": "2"},\n {"problem": "a\\ud800", "answer": "1"}]')
    with one_glance.raises(ValueError, match=rf"^{re.escape(str(path))}: row 2: field 'problem' holds a lone UTF-16 "
                                         r"surrogate '\\ud800' \(at character 2\)"):
        PromptDataModule(train_files=[str(path)]).train_problems()


def test_surrogate_pairs_and_escaped_backslashes_load(tmp_path):
    path = _rows(tmp_path / "prompts.jsonl", ['{"problem": "\\ud83d\\ude00 + 1 =", "answer": "2"}',
                                              '{"problem": "a \\\\ud800 b", "answer": "2"}'])
    problems = PromptDataModule(train_files=[str(path)]).train_problems()
    assert [p.problem for p in problems] == ["\U0001F600 + 1 =", "a \\ud800 b"]  # one emoji; a literal backslash-u


# ------------------------------------------------------------------------------- no held-out evaluation, silently
def test_empty_held_out_file_is_an_error_naming_the_file(tmp_path):
    train = _rows(tmp_path / "train.jsonl", [OK_ROW])
    empty = tmp_path / "held.jsonl"
    empty.write_text("\n\n")
    dm = PromptDataModule(train_files=[str(train)], val_files=[str(empty)])
    with one_glance.raises(ValueError) as err:
        dm.val_problems()
    msg = str(err.value)
    assert f"the held-out set is empty: data.val_files ['{empty}'] hold no row" in msg
    assert "trainer.limit_val_batches: 0" in msg  # the way to turn evaluation off


def test_empty_held_out_file_fails_at_set_up_before_any_step(tmp_path, preset_cache):
    empty = tmp_path / "held.jsonl"
    empty.write_text("")
    dm = PromptDataModule(train_files=[str(_prompt_file(tmp_path, ["1+1=", "2+3="]))], val_files=[str(empty)],
                          batch_size=2)
    m = MutualRLModule([_spec("a"), _spec("b")], reward="test_parity", log_samples_every_n_steps=0)
    fit = trainer(tmp_path, max_steps=1, limit_val_batches=1, val_check_interval=1)
    with one_glance.raises(ValueError, match=rf"data.val_files \['{re.escape(str(empty))}'\] hold no row"):
        fit.fit(m, datamodule=dm)
    assert fit.global_step == 0


@pytest.mark.parametrize("value", [0, -1])
def test_val_per_skill_below_one_is_an_error_naming_the_setting(value):
    with one_glance.raises(ValueError) as err:
        PromptDataModule(val_per_skill=value)
    msg = str(err.value)
    assert f"data.val_per_skill must be >= 1, or null for every held-out prompt (got {value})" in msg
    assert "trainer.limit_val_batches: 0" in msg


def test_task_without_held_out_problems_is_an_error_unless_evaluation_is_off(tmp_path):
    task = dict(operators=["+"], digits=1, num_train=20, num_heldout=0)
    with one_glance.raises(ValueError, match=r"data.task \(ArithmeticTask\) has no held-out problem \(num_heldout: 0\)"):
        PromptDataModule(task=ArithmeticTask(**task)).val_problems()
    dm = PromptDataModule(task=ArithmeticTask(**task))
    dm.trainer = trainer(tmp_path, limit_val_batches=0)  # the documented way to turn evaluation off
    assert dm.val_problems() == []


def test_training_files_without_held_out_files_warn_that_nothing_is_evaluated(tmp_path):
    train = str(_rows(tmp_path / "train.jsonl", [OK_ROW]))
    with pytest.warns(UserWarning, match=r"no held-out prompts: .*data.val_files nor data.val_dataset is set, so no "
                                         r"evaluation runs.*trainer.limit_val_batches: 0"):
        assert PromptDataModule(train_files=[train]).val_problems() == []
    dm = PromptDataModule(train_files=[train])
    dm.trainer = trainer(tmp_path, limit_val_batches=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dm.val_problems() == []
