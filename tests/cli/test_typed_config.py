"""Regimes and rollout engines are typed configuration: class_path/init_args, every argument in --help and every
default in --print_config; only the subcommands that do something exist."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml

from mutual_rl.cli import main
from mutual_rl.config_files import load_config
from mutual_rl.regimes import FTIS, GRAFT, HACPO, PRP, SGT, XGRPO, NoSharing

CONFIGS = Path(__file__).parents[2] / "configs"


def _run(args, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 0
    return capsys.readouterr().out


@pytest.mark.slow
def test_print_config_shows_every_default_of_the_chosen_regime(capsys):
    printed = yaml.safe_load(_run(["fit", "--config", str(CONFIGS / "sgt.yaml"), "--print_config"], capsys))
    regime = printed["model"]["regime"]
    assert regime["class_path"] == "mutual_rl.regimes.SGT"
    assert regime["init_args"] == {"coef": 0.1, "seed": 0}
    graft = yaml.safe_load(_run(["fit", "--config", str(CONFIGS / "graft.yaml"), "--print_config"], capsys))
    assert graft["model"]["regime"]["init_args"] == {"delta": 0.8, "balance": True, "policy_order": None,
                                                     "peer_last": "in_batch",
                                                     "compatibility": "weighted", "transfer": "group",
                                                     "update_rule": "graft", "rule_args": None}


@pytest.mark.slow
@pytest.mark.parametrize("cls", [NoSharing, XGRPO, PRP, SGT, GRAFT, HACPO, FTIS], ids=lambda c: c.__name__)
def test_help_documents_each_regimes_arguments(cls, capsys):
    out = _run(["fit", "--model.regime.help", cls.__name__], capsys)
    for name in inspect.signature(cls).parameters:
        assert f"--model.regime.{name}" in out, (cls.__name__, name)
    assert "``" not in out  # plain text, no RST markup
    top = _run(["fit", "--help"], capsys)
    assert f"mutual_rl.regimes.{cls.__name__}" in top  # listed among the known regimes


@pytest.mark.slow
def test_choices_are_checked_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(CONFIGS / "graft.yaml"), "--model.regime.peer_last", "first", "--print_config"])
    assert "peer_last" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(CONFIGS / "grpo.yaml"), "--model.algorithm.agg", "mean", "--print_config"])
    assert "agg" in capsys.readouterr().err


@pytest.mark.slow
def test_a_policy_overrides_the_regime_the_same_way(tmp_path, capsys):
    cfg = load_config(CONFIGS / "sgt.yaml")
    cfg["model"]["policies"][1]["regime"] = {"class_path": "GRAFT", "init_args": {"balance": False}}
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(cfg))
    printed = yaml.safe_load(_run(["fit", "--config", str(path), "--print_config"], capsys))
    own = printed["model"]["policies"][1]["regime"]
    assert own["class_path"] == "mutual_rl.regimes.GRAFT" and own["init_args"]["balance"] is False
    assert own["init_args"]["delta"] == 0.8


@pytest.mark.parametrize("sub", ["test", "predict"])
def test_subcommands_without_a_step_are_gone(sub, capsys):
    with pytest.raises(SystemExit) as exc:
        main([sub, "--help"])
    assert exc.value.code != 0


@pytest.mark.slow
def test_help_leaves_out_trainer_arguments_that_do_not_apply(capsys):
    from mutual_rl.cli import TRAINER_HIDDEN

    out = _run(["fit", "--help"], capsys)
    for name in TRAINER_HIDDEN:
        assert f"--trainer.{name} " not in out, name
    assert "--trainer.max_steps" in out and "--trainer.callbacks" in out
    lines = out.splitlines()
    # was 720 with every Trainer argument in the options and again in the usage; 615 once the token budget,
    # the rollout correction and --resume_required were added (2026-12-03)
    assert len(lines) < 640
    assert lines[0].startswith("usage: ") and "--model.KEY VALUE" in lines[0] and not lines[1].strip()  # one line
    with pytest.raises(SystemExit):  # manual optimization: each policy clips with its own optimizer.grad_clip
        main(["fit", "--config", str(CONFIGS / "grpo.yaml"), "--trainer.gradient_clip_val", "1.0", "--print_config"])
    assert "gradient_clip_val" in capsys.readouterr().err
