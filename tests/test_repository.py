"""The repository is self-contained (docs/design.md, rule 15): nothing in it points to files outside it.

README, docstrings, configs, scripts, tests and committed reports refer to ``docs/`` only, never to the internal
specification pages the project was written from. The forbidden strings are assembled at run time so that this
file does not contain them itself.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_spec = {name: name.upper() for name in ("methods", "calibration", "design")}  # the external page names
FORBIDDEN = (
    "../" + "shared",
    *(page + ".md" for page in _spec.values()),
    _spec["methods"] + " §",
    _spec["design"] + " rule",
    "(" + _spec["calibration"],
)
"""Strings that point outside the repository (to the external specification pages)."""

DOCS = ("docs/methods.md", "docs/design.md", "docs/calibration.md")

#: What the filesystem walk reads (the tracked-file check reads every tracked text file).
WALK_ROOTS = ("README.md", "src", "configs", "scripts", "tests", "docs", "results")
WALK_SUFFIXES = (".md", ".py", ".yaml", ".yml", ".sh", ".toml")
SKIP_DIRS = {".venv", "__pycache__", ".git", ".pytest_cache", ".ruff_cache"}


def _text(path: Path) -> str | None:
    """The file's text, or None for a binary (NUL byte or not UTF-8) or unreadable file."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _offences(paths) -> list[str]:
    """``file:line: forbidden string -> line`` for every occurrence in ``paths`` (relative to ROOT)."""
    out = []
    for rel in paths:
        text = _text(ROOT / rel)
        if text is None:
            continue
        for no, line in enumerate(text.splitlines(), 1):
            for bad in FORBIDDEN:
                if bad in line:
                    out.append(f"{rel}:{no}: {bad!r} in: {line.strip()[:160]}")
    return out


def _tracked_files() -> list[str]:
    try:
        res = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"not a git checkout ({err}); the filesystem walk below still checks the sources")
    return [p for p in res.stdout.decode("utf-8", "surrogateescape").split("\0") if p]


def _walked_files() -> list[str]:
    out = []
    for top in WALK_ROOTS:
        base = ROOT / top
        if base.is_file():
            out.append(top)
            continue
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            rel = path.relative_to(ROOT)
            parts = rel.parts
            if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in parts):
                continue
            if parts[0] == "results" and len(parts) > 2 and parts[2] == "runs":  # results/<name>/runs/...
                continue
            if path.is_file() and path.suffix in WALK_SUFFIXES:
                out.append(rel.as_posix())
    return out


def test_tracked_files_point_only_inside_the_repository():
    files = _tracked_files()
    assert files, "git ls-files listed nothing"
    bad = _offences(files)
    assert not bad, "references outside the repository (point into docs/ instead):\n" + "\n".join(bad)


def test_source_tree_points_only_inside_the_repository():
    """The same check over the working tree (also sees files not yet added to git)."""
    files = _walked_files()
    assert "README.md" in files and any(f.startswith("src/") for f in files)
    bad = _offences(files)
    assert not bad, "references outside the repository (point into docs/ instead):\n" + "\n".join(bad)


def test_docs_exist_and_readme_links_them():
    missing = [d for d in DOCS if not (ROOT / d).is_file()]
    assert not missing, f"missing documentation pages: {missing}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/" in readme, "README.md must link the docs/ folder"
    for page in DOCS:
        assert page in readme, f"README.md does not mention {page}"


def test_design_rules_referred_to_exist():
    """Every "docs/design.md, rule N" / "rules N and M" used in the sources names a numbered rule of the page."""
    import re

    design = (ROOT / "docs/design.md").read_text(encoding="utf-8")
    defined = {int(m) for m in re.findall(r"^(\d+)\. \*\*", design, flags=re.M)}
    used: dict[int, str] = {}
    for rel in _walked_files():
        text = _text(ROOT / rel) or ""
        for m in re.finditer(r"docs/design\.md, rules? ([\d ,and]+)", text):
            for n in re.findall(r"\d+", m.group(1)):
                used.setdefault(int(n), rel)
    unknown = {n: where for n, where in used.items() if n not in defined}
    assert not unknown, f"rules referred to but not numbered in docs/design.md: {unknown}"
