"""The data.task field takes either built-in task from YAML: by its fields alone, or by class_path over a base."""

from __future__ import annotations

import pytest
import yaml

from mutual_rl.cli import main

pytestmark = pytest.mark.slow  # the CLI parses each config


def _printed(tmp_path, capsys, *configs: str) -> dict:
    args = ["fit"]
    for i, text in enumerate(configs):
        path = tmp_path / f"c{i}.yaml"
        path.write_text(text)
        args += ["--config", str(path)]
    with pytest.raises(SystemExit) as exc:
        main(args + ["--print_config"])
    assert exc.value.code == 0
    return yaml.safe_load(capsys.readouterr().out)["data"]["task"]


POLICY = "model:\n  policies:\n    - {name: a, model: tiny:gpt2-bpe}\n"


def test_word_problem_fields_pick_the_word_problem_task(tmp_path, capsys):
    task = _printed(tmp_path, capsys, POLICY + "data:\n  task: {families: [ages, work], num_heldout: 50}\n")
    assert task["families"] == ["ages", "work"] and task["num_heldout"] == 50 and "operators" not in task


def test_arithmetic_question_style(tmp_path, capsys):
    task = _printed(tmp_path, capsys, POLICY + "data:\n  task: {style: question, answer_format: boxed}\n")
    assert task["style"] == "question" and task["operators"] == ["+", "-"]


def test_class_path_switches_the_task_over_an_arithmetic_base(tmp_path, capsys):
    base = POLICY + "data:\n  task: {operators: ['+'], digits: 2}\n"
    over = "data:\n  task: {class_path: mutual_rl.data.word_problems.WordProblemTask, init_args: {num_heldout: 50}}\n"
    task = _printed(tmp_path, capsys, base, over)
    assert "families" in task and task["num_heldout"] == 50 and "operators" not in task


def test_chain_fields_pick_the_chain_task(tmp_path, capsys):
    task = _printed(tmp_path, capsys, POLICY + "data:\n  task: {terms: 4, max_value: 60}\n")
    assert task["terms"] == 4 and task["max_value"] == 60 and "digits" not in task and "families" not in task
    over = "data:\n  task: {class_path: mutual_rl.data.chain.ChainTask, init_args: {num_heldout: 50}}\n"
    task = _printed(tmp_path, capsys, POLICY + "data:\n  task: {operators: ['+'], digits: 2}\n", over)
    assert task["terms"] == 3 and task["num_heldout"] == 50 and "digits" not in task
