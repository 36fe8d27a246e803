"""Every shipped YAML parses (``--print_config``) and runs 2 training steps (docs/design.md, rule 6); the real-model
configs (configs/real/) run theirs in tests/real/test_real_pair.py.

To keep the suite fast, the run uses the shipped file with only the tiny presets' warm-up shortened, 2 steps,
no evaluation, no logger; everything else is as shipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mutual_rl.cli import main
from mutual_rl.config_files import load_config

CONFIGS = sorted((Path(__file__).parents[2] / "configs").rglob("*.yaml"))
CPU_CONFIGS = [c for c in CONFIGS if "gpu" not in c.parts and "real" not in c.parts]
# configs/real/ loads a 135 M-parameter checkpoint (~45 s each): its 2-step run is tests/real/test_real_pair.py
REAL_CONFIGS = [c for c in CONFIGS if "real" in c.parts]
# a benchmark overlay (configs/v4.yaml) has no base: it is given after a regime's config (tests/compare/test_driver.py
# parses the merge as fit reads it)
BENCHMARK_OVERLAYS = {"v4.yaml"}


def test_there_are_configs():
    assert any(c.name == "grpo.yaml" for c in CONFIGS)


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_config_parses(path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(path), "--print_config"])
    assert exc.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["policies"], "a config must name its policies"


@pytest.mark.slow
@pytest.mark.parametrize("path", CPU_CONFIGS, ids=lambda p: p.name)
def test_config_runs_two_steps(path, tmp_path):
    cfg = load_config(path)
    for spec in cfg["model"]["policies"]:
        if spec["model"].startswith("tiny:"):
            spec.setdefault("warmstart", {})["steps"] = 10
            spec["warmstart"].pop("expect", None)  # the shipped ranges are for the shipped warm-up length
    cfg.setdefault("trainer", {}).update(
        max_steps=2, logger=False, enable_progress_bar=False, limit_val_batches=0, default_root_dir=str(tmp_path)
    )
    cfg["model"]["export_dir"] = str(tmp_path / "export")
    short = tmp_path / path.name
    short.write_text(yaml.safe_dump(cfg))
    main(["fit", "--config", str(short)])
    names = [p["name"] for p in cfg["model"]["policies"]]
    for name in names:
        assert (tmp_path / "export" / name / "config.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("path", CPU_CONFIGS, ids=lambda p: p.name)
def test_config_runs_with_kl_lora_and_repeated_problems(path, tmp_path):
    """Each shipped regime config with ordinary options on together: KL 1e-3, LoRA on every policy, and a prompt
    file of three identical problems (every batch of 4 repeats a prompt id), 2 steps through the CLI."""
    import json

    cfg = load_config(path)
    for spec in cfg["model"]["policies"]:
        if spec["model"].startswith("tiny:"):
            spec.setdefault("warmstart", {})["steps"] = 10
            spec["warmstart"].pop("expect", None)  # the shipped ranges are for the shipped warm-up length
        spec["lora"] = {"r": 4, "alpha": 8}
        spec.setdefault("sampling", {})["n"] = 4
    cfg["model"].setdefault("algorithm", {})["kl_coef"] = 1e-3
    cfg["model"]["export_dir"] = str(tmp_path / "export")
    same = tmp_path / "same.jsonl"
    same.write_text("".join(json.dumps({"problem": "12+34=", "answer": "46"}) + "\n" for _ in range(3)))
    cfg["data"] = {"train_files": [str(same)], "val_files": [str(same)], "batch_size": 4}
    cfg.setdefault("trainer", {}).update(
        max_steps=2, logger=False, enable_progress_bar=False, limit_val_batches=0, default_root_dir=str(tmp_path)
    )
    short = tmp_path / path.name
    short.write_text(yaml.safe_dump(cfg))
    main(["fit", "--config", str(short)])
    for name in [p["name"] for p in cfg["model"]["policies"]]:
        assert (tmp_path / "export" / name / "adapter_config.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("path", [c for c in CPU_CONFIGS + REAL_CONFIGS
                                           if c.name != "base.yaml" and c.name not in BENCHMARK_OVERLAYS],
                         ids=lambda p: str(p.relative_to(p.parents[1])))
def test_overlay_alone_equals_base_plus_overlay(path, capsys):
    """Each regime config is a small overlay of its folder's base.yaml (directly, or through another overlay there,
    as configs/real/sgt_vllm.yaml of sgt.yaml): alone, or composed after its base, it is the same run; load_config
    (what scripts/compare_regimes.py reads) gives the same regime and policies."""
    base = yaml.safe_load(path.read_text())["base"]
    assert (path.parent / base).is_file() and "/" not in base
    assert len(path.read_text().splitlines()) <= 15  # an overlay, not a copy
    printed = []
    for args in (["--config", str(path)], ["--config", str(path.parent / base), "--config", str(path)]):
        with pytest.raises(SystemExit):
            main(["fit", *args, "--print_config"])
        printed.append(yaml.safe_load(capsys.readouterr().out))
    assert printed[0] == printed[1]
    loaded = load_config(path)
    assert loaded["model"]["policies"] == yaml.safe_load((path.parent / "base.yaml").read_text())["model"]["policies"]
    assert printed[0]["model"]["regime"]["class_path"].rsplit(".", 1)[1] == loaded["model"]["regime"]["class_path"]
