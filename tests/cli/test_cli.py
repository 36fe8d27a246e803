"""The ``mutual-rl`` command: help shows documented arguments; validate evaluates pass@1."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from mutual_rl.cli import main


@pytest.mark.slow
def test_help_lists_documented_arguments():
    out = subprocess.run([sys.executable, "-m", "mutual_rl.cli", "fit", "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for text in ("--model.policies", "--model.algorithm.clip_high", "Upper clip", "--data.batch_size",
                 "prompts per training step", "sharing regime"):
        assert text in out.stdout, text


@pytest.mark.slow
def test_policy_fields_are_documented():
    out = subprocess.run(
        [sys.executable, "-m", "mutual_rl.cli", "fit", "--model.policies.help", "PolicySpec"],
        capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stderr
    for text in ("--model.policies.sampling.n", "Rollouts per prompt (group size G)", "tiny:gpt2-bpe"):
        assert text in out.stdout, text


@pytest.mark.slow
def test_validate_reports_pass_at_1(tmp_path, capsys):
    cfg = {
        "trainer": {"logger": False, "enable_progress_bar": False, "default_root_dir": str(tmp_path)},
        "model": {
            "policies": [{"name": "g", "model": "tiny:gpt2-bpe", "warmstart": {"steps": 10},
                          "sampling": {"max_new_tokens": 4}}],
            "evaluation": {"k": 2},
        },
        "data": {"task": {"operators": ["+"], "digits": 1, "num_heldout": 20}, "val_per_skill": 20},
    }
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump(cfg))
    main(["validate", "--config", str(path)])
    out = capsys.readouterr().out
    assert "g/val/pass@1" in out


def test_bad_policy_config_is_one_clear_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"model": {"policies": [{"name": "x", "model": "tiny:nope"}]},
                                    "trainer": {"logger": False, "enable_progress_bar": False}}))
    with pytest.raises(ValueError, match="Unknown tiny preset 'tiny:nope'; choose one of"):
        main(["fit", "--config", str(path)])
