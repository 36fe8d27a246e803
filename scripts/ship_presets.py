"""Build the tiny presets a config names from their recipe and write them into the package's shipped folders.

    python scripts/ship_presets.py                       # configs/base.yaml's presets
    python scripts/ship_presets.py --config configs/x.yaml --check   # rebuild and compare with what ships
    python scripts/ship_presets.py --config configs/grpo.yaml --config configs/v4.yaml   # benchmark v4's presets

Each preset is built in the pinned worker (one thread, AVX2 kernels) into a temporary cache, ignoring any shipped
copy (``MUTUAL_RL_PRESET_SHIPPED=0``), then copied to ``src/mutual_rl/presets/shipped/<cache folder name>`` with
the ``sha256`` of its weights added to ``done.json`` (what :mod:`mutual_rl.presets.shipped` checks at load).
``--check`` writes nothing: it prints, per preset, whether the rebuild gives the shipped bytes on this machine
(expected on an AVX2 machine like the one they were built on; not guaranteed elsewhere -- the reason they ship).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", action="append", default=None,
                    help="a fit config; repeat it for overlays, as with mutual-rl fit (default configs/base.yaml)")
    ap.add_argument("--check", action="store_true", help="rebuild and compare with the shipped folders; write nothing")
    ap.add_argument("--cache", default=None,
                    help="preset cache to build in (and reuse builds from); default a temporary folder")
    args = ap.parse_args()
    configs = args.config or ["configs/base.yaml"]
    os.environ["MUTUAL_RL_PRESET_SHIPPED"] = "0"
    os.environ.setdefault("MUTUAL_RL_PRESET_BUILD", "pinned")

    from mutual_rl.cli import build_cli
    from mutual_rl.model.spec import WarmStart
    from mutual_rl.presets.cache import load_preset, preset_dir, preset_key
    from mutual_rl.presets.shipped import SHIPPED_DIR, WEIGHTS, file_sha256

    sys.argv = sys.argv[:1]  # LightningCLI parses the args given here, not this script's
    cli = build_cli([a for c in configs for a in ("--config", c)] + ["--trainer.logger", "false"], run=False)
    task = cli.datamodule.task
    specs = [s for s in cli.model.specs if s.model.startswith("tiny:")]
    if not specs:
        raise SystemExit(f"{' + '.join(configs)} names no tiny preset (model: tiny:...)")
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        cache = args.cache or tmp
        for spec in specs:
            warmstart = spec.warmstart or WarmStart()
            key = preset_key(spec.model, spec.seed, warmstart, task, spec.prompt_template, spec.chat_template)
            built = preset_dir(key, cache)
            load_preset(spec.model, seed=spec.seed, warmstart=warmstart, task=task,
                        prompt_template=spec.prompt_template, chat_template=spec.chat_template, cache_dir=cache)
            digest = file_sha256(built / WEIGHTS)
            target = SHIPPED_DIR / built.name
            if args.check:
                shipped = json.loads((target / "done.json").read_text()).get("sha256") if target.exists() else None
                same = shipped == digest
                failed |= not same
                print(f"{spec.name} ({spec.model}): rebuilt {digest[:16]}, shipped {str(shipped)[:16]}: "
                      f"{'same bytes' if same else 'DIFFERENT'}")
                continue
            info = json.loads((built / "done.json").read_text())
            info["sha256"] = digest
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            for name in FILES:
                shutil.copyfile(built / name, target / name)
                (target / name).chmod(0o644)
            (target / "done.json").write_text(json.dumps(info, indent=1) + "\n")
            print(f"{spec.name} ({spec.model}): shipped {target} (sha256 {digest[:16]})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
