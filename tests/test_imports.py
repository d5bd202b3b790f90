"""The import graph stays layered and acyclic, and importing agent_r1 has no side effect.

Every import statement of every module is read with ``ast`` (those inside functions and
``if TYPE_CHECKING:`` blocks too, relative ones resolved), so a lazy import cannot hide an
upward dependency. An import of ``a.b.c`` also depends on the packages ``a.b`` and ``a``
(their ``__init__`` runs first), except the importer's own packages, which are being
imported already. Each failure names the file and line of the offending import.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Modules (or packages, with all their modules) whose imports are not checked: none.
ALLOWED: set[str] = set()

# agent_r1's layers, low to high: a module may import its own layer or a lower one. A module
# not listed (agent_r1 itself, cli, memory_plan, smoke, launch, pretrained, compare, stages) is layer 10.
LAYERS: dict[str, int] = {
    "agent_r1.paths": 1,
    "agent_r1.io": 1,
    "agent_r1.registry": 1,
    "agent_r1.errors": 1,
    "agent_r1.accelerator": 1,
    "agent_r1.config": 2,
    "agent_r1.algorithms": 3,
    "agent_r1.data": 4,
    "agent_r1.retrieval": 5,
    "agent_r1.env": 6,
    "agent_r1.rollout": 7,
    "agent_r1.evaluation": 8,
    "agent_r1.training": 9,
}
TOP_LAYER = 10


@dataclass(frozen=True)
class Edge:
    """``importer`` imports ``imported`` at ``path:line``."""

    importer: str
    imported: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.imported}"


def module_names(packages: list[str]) -> dict[str, Path]:
    """Every module under the top-level ``packages`` of the repo: ``{dotted name: file}``."""
    modules = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (``from ..x import y`` -> ``pkg.x``)."""
    if node.level == 0:
        return node.module or ""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported_names(importer: str, path: Path) -> Iterator[tuple[str, int]]:
    """``(dotted name, line)`` for every module an import statement in ``path`` may name:
    ``import a.b`` gives ``a.b``; ``from a import b`` gives ``a`` and ``a.b`` (``b`` may be a module)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(importer, _is_package(path), node)
            yield base, node.lineno
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno


def _with_packages(name: str, importer: str) -> list[str]:
    """``name`` and the packages above it whose ``__init__`` an import of it runs: all but the importer's own."""
    parts = name.split(".")
    chain = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return [m for m in chain if not (importer == m or importer.startswith(m + "."))]


def import_edges(modules: dict[str, Path]) -> list[Edge]:
    """Every ``importer -> imported`` edge between ``modules``, one per (pair, line)."""
    edges: set[Edge] = set()
    for importer, path in modules.items():
        rel = str(path.relative_to(ROOT))
        for name, line in imported_names(importer, path):
            for target in _with_packages(name, importer):
                if target in modules and target != importer:
                    edges.add(Edge(importer, target, rel, line))
    return sorted(edges, key=lambda e: (e.path, e.line, e.imported))


def allowed(module: str) -> bool:
    return any(module == a or module.startswith(a + ".") for a in ALLOWED)


def strongly_connected(nodes: list[str], edges: list[Edge]) -> list[list[str]]:
    """Tarjan's strongly connected components of the graph, those of more than one node."""
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    for e in edges:
        succ[e.importer].append(e.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:  # v is the root of a component: pop it
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            components.append(sorted(component))

    for n in nodes:
        if n not in index:
            visit(n)
    return [c for c in components if len(c) > 1]


def cycle_report(modules: dict[str, Path], edges: list[Edge]) -> list[str]:
    """One message per import cycle: its modules and every import between them."""
    messages = []
    for component in strongly_connected(sorted(modules), edges):
        inside = [str(e) for e in edges if e.importer in component and e.imported in component]
        messages.append("cycle among " + ", ".join(component) + ":\n    " + "\n    ".join(inside))
    return messages


def layer(module: str) -> int:
    """The layer of an agent_r1 module: that of its longest listed prefix, else :data:`TOP_LAYER`."""
    for prefix in sorted(LAYERS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return LAYERS[prefix]
    return TOP_LAYER


def checked_edges(modules: dict[str, Path]) -> list[Edge]:
    return [e for e in import_edges(modules) if not allowed(e.importer)]


def _imports_deepspeed(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] == "deepspeed" for a in node.names)
    return isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "deepspeed"


def _calls_select_accelerator(node: ast.AST) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return (isinstance(func, ast.Name) and func.id == "select_accelerator") or (
        isinstance(func, ast.Attribute) and func.attr == "select_accelerator"
    )


def unguarded_deepspeed_imports(path: Path) -> list[int]:
    """Lines of ``path`` that import deepspeed without a ``select_accelerator()`` call before them in
    the same function; at module level only ``if TYPE_CHECKING:`` may import it."""
    tree = ast.parse(path.read_text(), str(path))
    guarded: set[int] = set()  # id() of the import nodes that are fine
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            guarded |= {id(n) for n in ast.walk(node)}
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            calls = [n.lineno for n in ast.walk(node) if _calls_select_accelerator(n)]
            guarded |= {id(n) for n in ast.walk(node) if _imports_deepspeed(n) and calls and min(calls) < n.lineno}
    return sorted(n.lineno for n in ast.walk(tree) if _imports_deepspeed(n) and id(n) not in guarded)


def test_agent_r1_has_no_import_cycle() -> None:
    modules = module_names(["agent_r1"])
    assert not (cycles := cycle_report(modules, checked_edges(modules))), "\n".join(cycles)


def test_agent_r1_imports_only_its_own_layer_or_lower() -> None:
    upward = [
        f"{e} (layer {layer(e.importer)} imports layer {layer(e.imported)})"
        for e in checked_edges(module_names(["agent_r1"]))
        if layer(e.imported) > layer(e.importer)
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_flows_and_tasks_have_no_import_cycle() -> None:
    modules = module_names(["flows", "tasks"])
    assert not (cycles := cycle_report(modules, import_edges(modules))), "\n".join(cycles)


def test_the_graph_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    """The parser itself: an import inside a function and a relative one are both edges; a deepspeed
    import is fine only under TYPE_CHECKING or after select_accelerator() in its function."""
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from ..env import tools\n    import agent_r1.config\n")
    names = list(imported_names("agent_r1.data.m", path))
    assert ("agent_r1.env.tools", 2) in names and ("agent_r1.config", 3) in names
    assert _with_packages("agent_r1.env.tools", "agent_r1.data.m") == ["agent_r1.env", "agent_r1.env.tools"]
    edges = [Edge("a", "b", "a.py", 1), Edge("b", "c", "b.py", 2), Edge("c", "a", "c.py", 3)]
    assert strongly_connected(["a", "b", "c", "d"], edges) == [["a", "b", "c"]]
    path.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import deepspeed\n"
        "def f():\n    select_accelerator()\n    import deepspeed\n"
        "def g():\n    import deepspeed.comm\n    select_accelerator()\n"
        "import deepspeed\n"
    )
    assert unguarded_deepspeed_imports(path) == [8, 10]


def test_deepspeed_is_imported_only_after_the_accelerator_is_chosen() -> None:
    """DeepSpeed picks its accelerator when first imported: each import of it in agent_r1 sits in a
    function, after ``select_accelerator()``, so every entry point gets the same choice."""
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name} imports deepspeed before select_accelerator()"
        for name, path in module_names(["agent_r1"]).items()
        for line in unguarded_deepspeed_imports(path)
    ]
    assert not bad, "\n".join(bad)


def test_importing_training_leaves_the_environment_alone() -> None:
    """DeepSpeed picks its accelerator when first imported, so DS_ACCELERATOR is set right before
    that import, by the function that needs deepspeed; importing the modules sets nothing."""
    training = sorted(m for m in module_names(["agent_r1"]) if m.startswith("agent_r1.training."))
    assert {"agent_r1.training.logprobs", "agent_r1.training.distributed"} <= set(training)
    code = (
        "import importlib, os, sys\n"
        f"for name in {training!r}:\n"
        "    importlib.import_module(name)\n"
        "print(os.environ.get('DS_ACCELERATOR'), 'deepspeed' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "False"], f"DS_ACCELERATOR, deepspeed loaded: {out.stdout} ({training})"
