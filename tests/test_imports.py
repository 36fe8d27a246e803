"""Import structure: every module imports alone, the package's import graph has no cycle (lazy imports
included, so no cycle hides behind one), and regimes are pure: they never reach ``mutual_rl.distributed``, the
model, the update loop or the step (what needs a forward or the other processes they request)."""

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


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (annotations only, never imported)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
                stack.extend(child.orelse)
                continue
            stack.append(child)


def _imports(path: Path) -> list[str]:
    """Every ``mutual_rl`` module ``path`` imports at run time, at any depth (functions included)."""
    found = []
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mutual_rl"):
            found += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("mutual_rl")]
    return found


_NOT_FOR_REGIMES = ("mutual_rl.distributed", "mutual_rl.model", "mutual_rl.step", "mutual_rl.update.loop",
                    "mutual_rl.update.packing", "mutual_rl.rollout", "mutual_rl.strategies", "mutual_rl.sharding")


def test_regimes_run_no_model_and_no_collective():
    offenders = [f"{p.relative_to(SRC)} imports {name}" for m, p in _modules().items()
                 if m.startswith("mutual_rl.regimes")
                 for name in _imports(p) if any(name == n or name.startswith(n + ".") for n in _NOT_FOR_REGIMES)]
    assert not offenders, offenders
    found = [f"{p.relative_to(SRC)}: {word}" for m, p in _modules().items() if m.startswith("mutual_rl.regimes")
             for word in ("response_logp", "dummy_logp", "torch.distributed") if word in p.read_text()]
    assert not found, found


#: the package's layers, bottom to top (top-level modules and packages of ``mutual_rl``): records, statistics and the
#: interfaces the step calls; pure math, the THL and the distributed helpers (FSDP units included); prompts and
#: rewards; the model and its memory plan; the update and the rollout engines; regimes, the exchange, MWRA,
#: evaluation, presets; the step; its hosts (the CLI with its error report)
LAYERS = (
    ("types", "stats", "names", "sampling", "interfaces", "assets", "threads", "warnings_filters", "durable", "config_files",
     "rng"),
    ("algorithms", "thl", "distributed", "strategies", "sharding"),
    ("data", "rewards"),
    ("model", "memory"),
    ("update", "rollout"),
    ("regimes", "exchange", "allocation", "evaluation", "presets"),
    ("step",),
    ("callbacks", "module", "resume", "step_metrics", "cli", "cli_errors", "cli_parse_errors", "compare",
     "catalogue"),
)
#: the one import that runs up the layers: loading a ``tiny:`` policy builds the embedded preset (a plugin edge)
UPWARD_ALLOWED = {("mutual_rl.model.loading", "presets")}


def _top(module: str) -> str:
    return module.split(".")[1]


def upward_imports() -> set[tuple[str, str]]:
    """``(module, package)`` for every import from a lower layer into a higher one."""
    rank = {name: i for i, names in enumerate(LAYERS) for name in names}
    out = set()
    for m, p in _modules().items():
        if m == "mutual_rl":
            continue
        for name in _imports(p):
            target = _top(name) if name != "mutual_rl" else None
            if target and target in rank and rank[target] > rank[_top(m)]:
                out.add((m, target))
    return out


def test_every_module_is_in_a_layer():
    placed = {name for names in LAYERS for name in names}
    tops = {_top(m) for m in _modules() if m != "mutual_rl"}
    assert tops == placed, (sorted(tops - placed), sorted(placed - tops))


def test_imports_run_down_the_layers():
    assert upward_imports() == UPWARD_ALLOWED


#: collectives (``torch.distributed`` calls every rank must make) belong to the distributed helpers
COLLECTIVES = {"all_gather_object", "all_gather", "all_reduce", "broadcast", "broadcast_object_list", "barrier",
               "reduce_scatter", "gather_object", "scatter_object_list", "all_to_all", "send", "recv", "reduce"}
COLLECTIVE_HOMES = {"mutual_rl.distributed", "mutual_rl.strategies"}


def _is_collective(node: ast.AST) -> bool:
    """``torch.distributed.<collective>`` or ``dist.<collective>`` (the usual alias)."""
    if not (isinstance(node, ast.Attribute) and node.attr in COLLECTIVES):
        return False
    owner = ast.unparse(node.value)
    return owner == "dist" or owner.endswith("distributed")


def test_collectives_only_in_the_distributed_helpers():
    offenders = [f"{p.relative_to(SRC)}:{node.lineno} calls {node.attr}" for m, p in _modules().items()
                 if m not in COLLECTIVE_HOMES for node in ast.walk(ast.parse(p.read_text())) if _is_collective(node)]
    assert not offenders, offenders


def test_the_collective_check_sees_a_raw_collective():
    raw = ast.parse("import torch\ntorch.distributed.all_gather_object(out, x)\ndist.barrier()\npipe.send(1)")
    assert [n.attr for n in ast.walk(raw) if _is_collective(n)] == ["all_gather_object", "barrier"]


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


def _type_only_imports(path: Path) -> list[str]:
    """The ``mutual_rl`` modules ``path`` imports under ``if TYPE_CHECKING:`` (annotations only)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for sub in ast.walk(ast.Module(body=node.body, type_ignores=[])):
                if isinstance(sub, ast.ImportFrom) and sub.module and sub.module.startswith("mutual_rl"):
                    found.append(sub.module)
    return found


def test_type_only_imports_run_down_the_layers_too():
    """An annotation-only import up the layers is a cycle a type checker sees (interfaces <-> model.spec and
    types <-> update.objectives were two): none is left."""
    rank = {name: i for i, names in enumerate(LAYERS) for name in names}
    up = sorted(f"{m} -> {name}" for m, p in _modules().items() if m != "mutual_rl" for name in _type_only_imports(p)
                if rank.get(_top(name), -1) > rank[_top(m)])
    assert up == []
