"""Shipped preset weights: configs/base.yaml's presets load from the package (no build), the same bytes on any
machine; damaged folders are one clear error; MUTUAL_RL_PRESET_SHIPPED=0 builds from the recipe instead."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from mutual_rl.data.chain import ChainTask
from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.spec import WarmStart
from mutual_rl.presets import cache as preset_cache
from mutual_rl.presets import shipped as shipped_mod
from mutual_rl.presets.cache import load_preset, preset_dir, preset_key
from mutual_rl.presets.shipped import SHIPPED_DIR, file_sha256

ROOT = Path(__file__).resolve().parents[2]
TASK = ArithmeticTask(operators=["+", "-"], digits=2, num_train=400, num_heldout=20)


def base_presets(benchmark: str = "v3"):
    """(name, warmstart, task) of every tiny policy in configs/base.yaml (v3) or configs/v4.yaml (v4), as the
    trainer keys them."""
    if benchmark == "v4":
        cfg = yaml.safe_load((ROOT / "configs" / "v4.yaml").read_text())
        task = ChainTask(**cfg["data"]["task"]["init_args"])
    else:
        cfg = yaml.safe_load((ROOT / "configs" / "base.yaml").read_text())
        task = ArithmeticTask(**cfg["data"]["task"])
    out = []
    for p in cfg["model"]["policies"]:
        out.append((p["model"], WarmStart(**p["warmstart"]), task))
    return out


def _no_build(*a, **k):
    raise AssertionError("a shipped preset was built")


@pytest.mark.parametrize("benchmark", ["v3", "v4"])
def test_base_config_presets_ship_and_load_without_a_build(tmp_path, monkeypatch, benchmark):
    """Both presets of configs/base.yaml (benchmark v3) and of configs/v4.yaml have a shipped folder under their key;
    loading one builds nothing, writes nothing to the cache and gives exactly the shipped weights; the stored report
    lies inside the config's expect."""
    monkeypatch.setattr(preset_cache, "_build", _no_build)
    presets = base_presets(benchmark)
    assert [n for n, _, _ in presets] == ["tiny:gpt2-bpe", "tiny:llama-char"]
    for name, ws, task in presets:
        key = preset_key(name, 0, ws, task, "{problem}")
        folder = SHIPPED_DIR / preset_dir(key, tmp_path).name
        info = json.loads((folder / "done.json").read_text())
        assert info["sha256"] == file_sha256(folder / "model.safetensors")
        assert info["build"]["pinned"] is True and info["warmstart"]["steps"] == ws.steps
        for skill, (low, high) in ws.expect.items():
            assert low <= info["quality"]["skills"][skill]["pass@1"] <= high, (name, skill)
        model, tok = load_preset(name, seed=0, warmstart=ws, task=task, prompt_template="{problem}",
                                 cache_dir=tmp_path)
        stored = load_file(folder / "model.safetensors")
        state = model.state_dict()
        assert stored and all(torch.equal(state[k], v) for k, v in stored.items())
        assert tok.padding_side == "left" and tok.eos_token_id is not None
    assert not (tmp_path / "presets").exists()  # nothing built, nothing cached


def _ship(tmp_path, monkeypatch, ws):
    """A tiny build copied into a temporary shipped folder (as scripts/ship_presets.py does); its path."""
    load_preset("tiny:llama-char", seed=0, warmstart=ws, task=TASK, prompt_template="{problem}",
                cache_dir=tmp_path / "build")
    key = preset_key("tiny:llama-char", 0, ws, TASK, "{problem}")
    src = preset_dir(key, tmp_path / "build")
    shipped_root = tmp_path / "shipped"
    monkeypatch.setattr(shipped_mod, "SHIPPED_DIR", shipped_root)
    dst = shipped_root / src.name
    shutil.copytree(src, dst)
    info = json.loads((dst / "done.json").read_text())
    info["sha256"] = file_sha256(dst / "model.safetensors")
    (dst / "done.json").write_text(json.dumps(info))
    return dst


def test_shipped_folder_wins_and_the_env_builds_from_the_recipe(tmp_path, monkeypatch):
    ws = WarmStart(steps=3, batch_size=8)
    kw = dict(seed=0, warmstart=ws, task=TASK, prompt_template="{problem}")
    dst = _ship(tmp_path, monkeypatch, ws)
    monkeypatch.setattr(preset_cache, "_build", _no_build)
    model, _ = load_preset("tiny:llama-char", cache_dir=tmp_path / "user", **kw)
    assert not (tmp_path / "user").exists()
    stored, state = load_file(dst / "model.safetensors"), model.state_dict()
    assert stored and all(torch.equal(state[k], v) for k, v in stored.items())
    monkeypatch.setenv("MUTUAL_RL_PRESET_SHIPPED", "0")  # the recipe: a build into the user's cache
    with pytest.raises(AssertionError, match="a shipped preset was built"):
        load_preset("tiny:llama-char", cache_dir=tmp_path / "user", **kw)
    monkeypatch.setenv("MUTUAL_RL_PRESET_SHIPPED", "no")
    with pytest.raises(ValueError, match=r"MUTUAL_RL_PRESET_SHIPPED='no': use 1 .* or 0"):
        load_preset("tiny:llama-char", cache_dir=tmp_path / "user", **kw)


def test_damaged_shipped_folder_is_one_clear_error(tmp_path, monkeypatch):
    ws = WarmStart(steps=3, batch_size=8)
    kw = dict(seed=0, warmstart=ws, task=TASK, prompt_template="{problem}", cache_dir=tmp_path / "user")
    dst = _ship(tmp_path, monkeypatch, ws)
    weights = dst / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match=rf"shipped preset {dst}: model.safetensors has sha256 .* damaged: "
                                           "reinstall mutual-rl, or set MUTUAL_RL_PRESET_SHIPPED=0"):
        load_preset("tiny:llama-char", **kw)
    weights.unlink()
    with pytest.raises(RuntimeError, match="model.safetensors has sha256 None"):
        load_preset("tiny:llama-char", **kw)
    info = json.loads((dst / "done.json").read_text())
    info["warmstart"]["steps"] = 4  # a key that is not the request's
    (dst / "done.json").write_text(json.dumps(info))
    with pytest.raises(RuntimeError, match="its done.json key .* is not the requested"):
        load_preset("tiny:llama-char", **kw)
    assert not (tmp_path / "user").exists()


@pytest.mark.slow
@pytest.mark.parametrize("env", [{"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "2"},
                                 {"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "1"}])
def test_shipped_presets_same_weights_and_quality_under_other_kernels(tmp_path, env):
    """Another instruction set and thread count (a fresh interpreter: ATen picks its kernels at start-up) loads the
    same bytes and measures the same quality within 2 points per skill (the quality report re-run there against
    the one stored at the build)."""
    code = (
        "import json, sys, torch, hashlib\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from test_shipped import base_presets\n"
        "from mutual_rl.presets.cache import load_preset\n"
        "from mutual_rl.presets.quality import quality_report\n"
        "out = {'cap': torch.backends.cpu.get_cpu_capability(), 'threads': torch.get_num_threads(), 'presets': []}\n"
        "for name, ws, task in base_presets():\n"
        "    m, tok = load_preset(name, seed=0, warmstart=ws, task=task, prompt_template='{problem}')\n"
        "    r = quality_report(m, tok, task, name=name, prompt_template='{problem}', chat_template=False)\n"
        "    h = hashlib.sha256(b''.join(v.numpy().tobytes() for v in m.state_dict().values())).hexdigest()\n"
        "    out['presets'].append({'name': name, 'state': h, 'skills': {s: v['pass@1'] for s, v in r['skills'].items()}})\n"
        "print(json.dumps(out))\n"
    )
    run_env = {**os.environ, **env, "MUTUAL_RL_CACHE": str(tmp_path), "MKL_NUM_THREADS": env["OMP_NUM_THREADS"]}
    res = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], env=run_env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["cap"] == env["ATEN_CPU_CAPABILITY"].upper() and out["threads"] == int(env["OMP_NUM_THREADS"])
    assert not (tmp_path / "presets").exists()
    for p, (name, ws, task) in zip(out["presets"], base_presets()):
        m, _ = load_preset(name, seed=0, warmstart=ws, task=task, prompt_template="{problem}", cache_dir=tmp_path)
        import hashlib

        here = hashlib.sha256(b"".join(v.numpy().tobytes() for v in m.state_dict().values())).hexdigest()
        assert p["state"] == here
        key = preset_key(name, 0, ws, task, "{problem}")
        stored = json.loads((SHIPPED_DIR / preset_dir(key, tmp_path).name / "done.json").read_text())["quality"]
        for skill, value in p["skills"].items():
            assert abs(value - stored["skills"][skill]["pass@1"]) <= 0.02, (name, skill, value)
