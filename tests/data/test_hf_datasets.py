"""Hugging Face datasets as prompt sources: saved folders, data files, the Hub (monkeypatched), column mapping."""

from __future__ import annotations

import json
import sys

import pytest

from mutual_rl.data.datamodule import PromptDataModule
from mutual_rl.data.files import load_problems
from mutual_rl.data.hf_datasets import HFDataset, load_dataset_problems
from mutual_rl.types import Problem

datasets = pytest.importorskip("datasets")

GSM = {"question": ["Tom has 3 apples and buys 4. How many?", "What is 6 * 12?"],
       "answer": ["3 + 4 = 7\n#### 7", "6 * 12 = 72\n#### 72"], "level": [1, 2], "source": ["a", "b"]}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Data files are converted to Arrow in a cache: keep it in the test's folder."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


def test_saved_dataset_round_trip_keeps_the_other_columns(tmp_path):
    datasets.Dataset.from_dict(GSM).save_to_disk(str(tmp_path / "gsm"))
    got = load_dataset_problems(HFDataset(str(tmp_path / "gsm")), problem_key="question", answer_regex=r"####\s*(.+)",
                                skill_key="level", id_offset=10)
    assert got == [Problem(10, GSM["question"][0], "7", "1"), Problem(11, GSM["question"][1], "72", "2")]
    assert [p.columns for p in got] == [{"level": 1, "source": "a"}, {"level": 2, "source": "b"}]


def test_saved_dataset_dict_needs_a_split(tmp_path):
    train = datasets.Dataset.from_dict({"problem": ["1+1="], "answer": [2]})
    test = datasets.Dataset.from_dict({"problem": ["2+2=", "3+3="], "answer": [4, 6.0]})
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "dd"))
    got = load_dataset_problems({"path": str(tmp_path / "dd"), "split": "test"})
    assert [(p.problem, p.answer) for p in got] == [("2+2=", "4"), ("3+3=", "6")]  # answers as in files.py
    with pytest.raises(ValueError, match=r"has the splits \['test', 'train'\]: choose one with split:"):
        load_dataset_problems(HFDataset(str(tmp_path / "dd")))
    with pytest.raises(ValueError, match=r"has no split 'validation'; its splits: \['test', 'train'\]"):
        load_dataset_problems(HFDataset(str(tmp_path / "dd"), split="validation"), label="data.val_dataset")


def test_saved_dataset_with_a_recorded_split_must_match(tmp_path):
    f = tmp_path / "rows.csv"
    f.write_text("problem,answer\n1+1=,2\n")
    datasets.load_dataset("csv", data_files=str(f), split="train").save_to_disk(str(tmp_path / "saved"))
    assert len(load_dataset_problems(HFDataset(str(tmp_path / "saved"), split="train"))) == 1
    with pytest.raises(ValueError, match=r"the saved dataset is split 'train', not 'test'"):
        load_dataset_problems(HFDataset(str(tmp_path / "saved"), split="test"))


def test_csv_and_json_data_files_through_datasets(tmp_path):
    csv = tmp_path / "rows.csv"
    csv.write_text("q,a,topic\n12+34=,46,add\n50-8=,42,sub\n")
    got = load_dataset_problems(HFDataset(str(csv)), problem_key="q", answer_key="a", id_offset=5)
    assert got == [Problem(5, "12+34=", "46"), Problem(6, "50-8=", "42")]  # csv integers -> "46"
    assert got[1].columns == {"topic": "sub"}
    js = tmp_path / "rows.jsonl"
    js.write_text("\n".join(json.dumps({"problem": p, "answer": a}) for p, a in [("1+1=", 2), ("x", "y")]) + "\n")
    assert [p.answer for p in load_dataset_problems(HFDataset(str(js), split="train[1:]"))] == ["y"]
    with pytest.raises(ValueError, match=r"name apply to Hub datasets only, not to a data file"):
        load_dataset_problems(HFDataset(str(csv), name="main"), problem_key="q", answer_key="a")
    with pytest.raises(ValueError, match=r"cannot load data file .*Unknown split \"test\".*rows are the split 'train'"):
        load_dataset_problems(HFDataset(str(csv), split="test"), problem_key="q", answer_key="a")


def test_hub_name_goes_to_load_dataset_with_the_exact_arguments(monkeypatch):
    calls = []

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return datasets.Dataset.from_dict(GSM)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    src = HFDataset("openai/gsm8k", split="train", name="main", revision="e53f048")
    got = load_dataset_problems(src, problem_key="question", answer_regex=r"####\s*(.+)")
    assert calls == [(("openai/gsm8k", "main"), {"split": "train", "revision": "e53f048"})]
    assert [p.answer for p in got] == ["7", "72"] and got[0].columns == {"level": 1, "source": "a"}


def test_hub_failures_name_the_source_and_the_fix(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach the Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match=r"^data.val_dataset: cannot load Hub dataset 'openai/gsm8k' \(name 'main', "
                                         r"split 'test'\) \(ConnectionError: Couldn't reach the Hub\); check path"):
        load_dataset_problems(HFDataset("openai/gsm8k", split="test", name="main"), label="data.val_dataset")


def test_missing_column_names_the_columns_present(tmp_path):
    datasets.Dataset.from_dict(GSM).save_to_disk(str(tmp_path / "gsm"))
    with pytest.raises(ValueError, match=r"has no column 'problem' \(data.problem_key\); columns present: "
                                         r"\['question', 'answer', 'level', 'source'\]. Name the right column"):
        load_dataset_problems(HFDataset(str(tmp_path / "gsm")))
    with pytest.raises(ValueError, match=r"has no column 'difficulty' \(data.skill_key\)"):
        load_dataset_problems(HFDataset(str(tmp_path / "gsm")), problem_key="question", skill_key="difficulty")


def test_bad_rows_and_patterns_name_the_row(tmp_path):
    datasets.Dataset.from_dict({"problem": ["a", "b"], "answer": ["1", None]}).save_to_disk(str(tmp_path / "d"))
    with pytest.raises(ValueError, match=r"data.train_dataset '.*d': row 2: key 'answer' is empty or invalid \(None\)"):
        load_dataset_problems(HFDataset(str(tmp_path / "d")))
    datasets.Dataset.from_dict({"problem": ["a"], "answer": ["no marker"]}).save_to_disk(str(tmp_path / "e"))
    with pytest.raises(ValueError, match=r"row 1: data.answer_regex '####\\\\s\*\(\.\+\)' finds no answer in 'answer'"):
        load_dataset_problems(HFDataset(str(tmp_path / "e")), answer_regex=r"####\s*(.+)")
    with pytest.raises(ValueError, match=r"data.answer_regex '\(' is not a valid regular expression"):
        PromptDataModule(answer_regex="(")


def test_local_paths_that_do_not_exist_and_a_missing_library(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"data.train_dataset: '.*nothing.parquet' does not exist"):
        load_dataset_problems(HFDataset(str(tmp_path / "nothing.parquet")))
    with pytest.raises(FileNotFoundError, match=r"does not exist"):
        load_dataset_problems(HFDataset("./no/such/folder"))
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes the import fail
    with pytest.raises(ImportError, match=r"data.train_dataset 'openai/gsm8k' needs the Hugging Face datasets "
                                          r"library: pip install datasets"):
        load_dataset_problems(HFDataset("openai/gsm8k"))


def test_datamodule_takes_datasets_beside_files(tmp_path):
    datasets.Dataset.from_dict(GSM).save_to_disk(str(tmp_path / "gsm"))
    rows = tmp_path / "val.jsonl"
    rows.write_text(json.dumps({"question": "q", "answer": "#### 5", "level": 9, "note": "x"}) + "\n")
    dm = PromptDataModule(train_dataset=HFDataset(str(tmp_path / "gsm")), val_files=[str(rows)],
                          problem_key="question", answer_regex=r"####\s*(.+)", batch_size=2)
    assert [p.answer for p in dm.train_problems()] == ["7", "72"] and dm.task is None
    assert [p.prompt_id for p in dm.train_problems()] == [10**9, 10**9 + 1]
    (val,) = dm.val_problems()
    assert (val.prompt_id, val.answer, val.columns) == (2 * 10**9, "5", {"level": 9, "note": "x"})
    dm2 = PromptDataModule(train_files=[str(rows)], val_dataset={"path": str(tmp_path / "gsm")}, problem_key="question")
    assert len(dm2.val_problems()) == 2
    with pytest.raises(ValueError, match=r"data.train_files and data.train_dataset are both given: choose one"):
        PromptDataModule(train_files=[str(rows)], train_dataset=HFDataset(str(tmp_path / "gsm")))
    with pytest.raises(ValueError, match=r"data.val_files and data.val_dataset are both given"):
        PromptDataModule(val_files=[str(rows)], val_dataset=HFDataset(str(tmp_path / "gsm")))


def test_jsonl_rows_keep_their_other_fields(tmp_path):
    f = tmp_path / "b.jsonl"
    f.write_text(json.dumps({"problem": "1+1=", "answer": 2, "steps": ["1+1"], "meta": {"k": 1}}) + "\n")
    (p,) = load_problems(f)
    assert p.columns == {"steps": ["1+1"], "meta": {"k": 1}}
    f.write_text(json.dumps({"problem": "1+1=", "answer": float("nan")}) + "\n")  # not a valid answer
    with pytest.raises(ValueError, match=r"line 1: key 'answer' is empty or invalid \(nan\)"):
        load_problems(f)


@pytest.mark.slow
def test_the_config_shapes_parse(capsys):
    import yaml

    from mutual_rl.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["fit", "--data.train_dataset", "{path: openai/gsm8k, name: main, split: train}",
              "--data.answer_regex", r"####\s*(.+)",
              "--model.policies", '[{name: a, model: "tiny:llama-char"}]',
              "--model.reward", "[{fn: math_verify, weight: 1.0}, {fn: boxed_format, weight: 0.2}]", "--print_config"])
    assert exc.value.code == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["data"]["train_dataset"] == {"path": "openai/gsm8k", "split": "train", "name": "main", "revision": None}
    assert cfg["data"]["answer_regex"] == r"####\s*(.+)"  # a pattern starting with '#' is not a YAML comment
    assert cfg["model"]["reward"] == [{"fn": "math_verify", "weight": 1.0, "name": None, "style": "auto"},
                                      {"fn": "boxed_format", "weight": 0.2, "name": None, "style": "auto"}]
