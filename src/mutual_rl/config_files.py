"""Config files as ``mutual-rl fit --config`` reads them: a top-level ``base:`` key names the config(s) an overlay
builds on (relative to the overlay), expanded into several ``--config`` arguments, bases first.

Used by the CLI (:mod:`mutual_rl.cli`) and by the comparison (:mod:`mutual_rl.compare`), which reads the shipped
configs itself.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml


def expand_config_bases(argv: list[str]) -> list[str]:
    """``argv`` with every ``--config FILE`` whose YAML has a top-level ``base:`` (a path relative to FILE, or a
    list of them) replaced by ``--config <base> ... --config <FILE without the key>``, bases first and expanded
    the same way, so an overlay such as ``configs/sgt.yaml`` (``base: base.yaml``) runs alone and composes
    (``--config configs/base.yaml --config configs/sgt.yaml`` applies the base twice, which changes nothing).
    Later files override earlier ones key by key, as jsonargparse merges several ``--config``."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token in ("--config", "-c") and i + 1 < len(argv):
            out += _config_with_bases(argv[i + 1], ())
            i += 2
            continue
        if token.startswith("--config="):
            out += _config_with_bases(token.split("=", 1)[1], ())
        else:
            out.append(token)
        i += 1
    return out


def load_config(path: str | Path) -> dict:
    """The YAML at ``path`` with its ``base:`` chain merged in, as ``mutual-rl fit --config path`` reads it: later
    files override earlier ones key by key (nested mappings merge; lists are replaced; a ``class_path`` mapping
    that names the same class, or none, merges its ``init_args``, another class replaces it)."""
    merged: dict = {}
    args = expand_config_bases(["--config", str(path)])
    for file in args[1::2]:
        merged = _merge(merged, yaml.safe_load(Path(file).read_text()) or {})
    return merged


def _merge(old, new):
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return new
    if "class_path" in old and new.get("class_path", old["class_path"]) != old["class_path"]:
        return new
    out = dict(old)
    for key, value in new.items():
        out[key] = _merge(out[key], value) if key in out else value
    return out


def _config_with_bases(path: str, seen: tuple[Path, ...]) -> list[str]:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text()) if p.is_file() else None
    except (OSError, yaml.YAMLError):
        data = None  # jsonargparse reports unreadable config files itself
    if not isinstance(data, dict) or "base" not in data:
        return ["--config", path]
    if p.resolve() in seen:
        raise SystemExit(f"config {path}: its base: chain comes back to itself ({' -> '.join(map(str, seen))}).")
    bases = data.pop("base")
    out: list[str] = []
    for base in bases if isinstance(bases, list) else [bases]:
        target = (p.parent / str(base)).resolve()
        if not target.is_file():
            raise SystemExit(f"config {path}: base: {base} is not a file ({target} does not exist); give the base "
                             "config's path relative to this file.")
        out += _config_with_bases(str(target), (*seen, p.resolve()))
    overlay = Path(tempfile.mkdtemp(prefix="mutual-rl-config-")) / p.name
    overlay.write_text(yaml.safe_dump(data, sort_keys=False))
    return out + ["--config", str(overlay)]
