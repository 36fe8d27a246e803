"""Import structure: every module imports alone, the package's import graph has no cycle (lazy imports
included, so no cycle hides behind one), and regimes and evaluation never reach ``mutual_rl.distributed``
directly (they use ``mutual_rl.update.lockstep``)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src" / "mutual_rl"


def _modules() -> dict[str, Path]:
    out = {}
    for p in SRC.rglob("*.py"):
        name = ".".join(("mutual_rl", *p.relative_to(SRC).with_suffix("").parts)).removesuffix(".__init__")
        out[name] = p
    return out


def _imports(path: Path) -> list[str]:
    """Every ``mutual_rl`` module ``path`` imports, at any depth (functions included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mutual_rl"):
            found += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("mutual_rl")]
    return found


def test_regimes_and_evaluation_never_import_distributed():
    offenders = [f"{p.relative_to(SRC)} imports {name}" for m, p in _modules().items()
                 if m.startswith(("mutual_rl.regimes", "mutual_rl.evaluation"))
                 for name in _imports(p) if name == "mutual_rl.distributed" or name.startswith("mutual_rl.distributed.")]
    assert not offenders, offenders


def test_import_graph_has_no_cycle():
    mods = _modules()
    graph = {m: {t for t in _imports(p) if t in mods and t != m} for m, p in mods.items()}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return path[path.index(t):] + [t]
            if t not in state and (cycle := visit(t)):
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, " -> ".join(cycle)


@pytest.mark.slow
def test_every_module_imports_alone():
    """Each module imported first, with no other ``mutual_rl`` module loaded (one fresh interpreter for all)."""
    code = (
        "import importlib, sys\n"
        f"names = {sorted(_modules())!r}\n"
        "bad = []\n"
        "for name in names:\n"
        "    for k in [k for k in sys.modules if k == 'mutual_rl' or k.startswith('mutual_rl.')]:\n"
        "        del sys.modules[k]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as e:\n"
        "        bad.append(f'{name}: {e!r}')\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
