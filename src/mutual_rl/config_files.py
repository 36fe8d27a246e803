"""Config files as ``mutual-rl fit --config`` reads them: a top-level ``base:`` key names the config(s) an overlay
builds on (relative to the overlay), expanded into several ``--config`` arguments, bases first.

Every file is given to jsonargparse by its own path (no copy is written anywhere), so a relative path inside a
config (a sub-config such as ``data: data/gsm8k.yaml``, a ``Path`` value) resolves relative to the file it is
written in, with or without ``base:``; the ``base`` key itself is dropped from exactly the files whose chain was
expanded here (jsonargparse's YAML loader, wrapped once). A YAML syntax error -- a tab in the indentation above
all -- is one error naming the file, the line and the column.

Used by the CLI (:mod:`mutual_rl.cli`) and by the comparison (:mod:`mutual_rl.compare`), which reads the shipped
configs itself.
"""

from __future__ import annotations

from pathlib import Path

import yaml

_EXPANDED: set[str] = set()
"""The texts of the config files whose ``base:`` was expanded: the wrapped loader drops ``base`` from these."""


def expand_config_bases(argv: list[str]) -> list[str]:
    """``argv`` with every ``--config FILE`` whose YAML has a top-level ``base:`` (a path relative to FILE, or a
    list of them) replaced by ``--config <base> ... --config FILE``, bases first and expanded the same way, so an
    overlay such as ``configs/sgt.yaml`` (``base: base.yaml``) runs alone and composes (``--config
    configs/base.yaml --config configs/sgt.yaml`` applies the base twice, which changes nothing). Later files
    override earlier ones key by key, as jsonargparse merges several ``--config``; jsonargparse reads FILE with
    its ``base`` key dropped (module docstring). A config file that is not valid YAML raises ``SystemExit`` naming
    the file, the line and the column."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token in ("--config", "-c") and i + 1 < len(argv):
            out += _config_args(argv[i + 1])
            i += 2
            continue
        if token.startswith("--config="):
            out += _config_args(token.split("=", 1)[1])
        else:
            out.append(token)
        i += 1
    return out


def load_config(path: str | Path) -> dict:
    """The YAML at ``path`` with its ``base:`` chain merged in, as ``mutual-rl fit --config path`` reads it: later
    files override earlier ones key by key (nested mappings merge; lists are replaced; a ``class_path`` mapping
    that names the same class, or none, merges its ``init_args``, another class replaces it)."""
    merged: dict = {}
    for file in _chain(Path(path), ()):
        data = _read_yaml(file)
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if k != "base"}
        merged = _merge(merged, data or {})
    return merged


def merge_config(old: dict, new: dict) -> dict:
    """``new`` over ``old`` as a later ``--config`` file goes over an earlier one (nested mappings merge, lists are
    replaced, a ``class_path`` naming another class replaces the mapping)."""
    return _merge(old, new)


def _merge(old, new):
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return new
    if "class_path" in old and new.get("class_path", old["class_path"]) != old["class_path"]:
        return new
    out = dict(old)
    for key, value in new.items():
        out[key] = _merge(out[key], value) if key in out else value
    return out


def _read_yaml(path: Path):
    """The YAML at ``path``; a syntax error is ``SystemExit`` naming the file, the line and the column (a tab where
    YAML wants indentation is said so)."""
    text = path.read_text(encoding="utf-8")
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        if mark is None:
            raise SystemExit(f"config {path}: not valid YAML ({exc}).") from None
        lines = text.splitlines()
        line = lines[mark.line] if mark.line < len(lines) else ""
        tab = (mark.column < len(line) and line[mark.column] == "\t") or "\\t" in str(exc.problem)
        what = ("a tab character: YAML forbids tabs for indentation; indent with spaces" if tab else
                f"{exc.problem}" + (f" ({exc.context})" if exc.context else ""))
        shown = line.replace("\t", "\\t")  # tabs visible; the caret under the column
        caret = len(line[: mark.column].replace("\t", "\\t"))
        raise SystemExit(f"config {path}: line {mark.line + 1}, column {mark.column + 1}: {what}.\n"
                         f"  {shown.rstrip()}\n  {' ' * caret}^") from None
    except yaml.YAMLError as exc:
        raise SystemExit(f"config {path}: not valid YAML ({exc}).") from None


def _base_list(path: Path, data) -> list[Path]:
    """The files named by ``data``'s ``base:`` (relative to ``path``), each checked to exist."""
    bases = data["base"]
    out = []
    for base in bases if isinstance(bases, list) else [bases]:
        target = (path.parent / str(base)).resolve()
        if target.is_dir():
            raise SystemExit(f"config {path}: base: {base} is a folder ({target}), not a config file; give the base "
                             "config's path relative to this file (e.g. base: base.yaml).")
        if not target.is_file():
            raise SystemExit(f"config {path}: base: {base} is not a file ({target} does not exist); give the base "
                             "config's path relative to this file.")
        out.append(target)
    return out


def _chain(path: Path, seen: tuple[Path, ...]) -> list[Path]:
    """``path``'s ``base:`` chain, bases first, ``path`` last."""
    data = _read_yaml(path) if path.is_file() else None
    if not isinstance(data, dict) or "base" not in data:
        return [path]
    if path.resolve() in seen:
        raise SystemExit(f"config {path}: its base: chain comes back to itself ({' -> '.join(map(str, seen))}).")
    out: list[Path] = []
    for target in _base_list(path, data):
        out += _chain(target, (*seen, path.resolve()))
    return out + [path]


def _config_args(path: str) -> list[str]:
    """``--config`` arguments for ``path`` and its bases; ``path`` itself is passed as given."""
    p = Path(path)
    try:
        files = _chain(p, ())
    except (OSError, UnicodeDecodeError):
        return ["--config", path]  # jsonargparse reports unreadable config files itself
    if files == [p]:
        return ["--config", path]
    for file in files:
        data = _read_yaml(file)
        if isinstance(data, dict) and "base" in data:
            _EXPANDED.add(file.read_text(encoding="utf-8"))
    _drop_base_on_load()
    out: list[str] = []
    for file in files:
        out += ["--config", path if file is p else str(file)]
    return out


def _drop_base_on_load() -> None:
    """Wrap jsonargparse's YAML loader (once) so that it drops the top-level ``base`` key of the files whose chain
    :func:`expand_config_bases` expanded; every other text loads as before."""
    from jsonargparse import get_loader, set_loader

    loader = get_loader("yaml")
    if getattr(loader, "_mutual_rl_drops_base", False):
        return

    def load(value):
        out = loader(value)
        if isinstance(out, dict) and "base" in out and value in _EXPANDED:
            out = {k: v for k, v in out.items() if k != "base"}
        return out

    load._mutual_rl_drops_base = True
    set_loader("yaml", load, exceptions=(yaml.YAMLError,))
