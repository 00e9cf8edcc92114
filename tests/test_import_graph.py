"""The frame of the house: the project's import graph has no cycle and no import running up a floor.

Floors, from the ground up: `core` (imports nothing of the project); `data`, `models`,
`dist_algos` (import `core` only, not each other); `engine`, the runner (imports the floors
below); `cli.py` and `bench/` on top. The graph is read with `ast` from every module, imports
inside functions included (an import hidden in a function to dodge a cycle is still an edge).
An import of the project's own module inside a function is allowed only where it defers a heavy
optional dependency: the imported module itself imports one of HEAVY_OPTIONAL at its top.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FLOORS = {"core": 0, "data": 1, "models": 1, "dist_algos": 1, "engine": 2, "cli": 3, "bench": 3}
#: packages too heavy, or too rarely needed, to import before they are chosen
HEAVY_OPTIONAL = ("ffcv", "nvidia.dali", "wandb", "matplotlib", "submitit", "deepspeed", "numba", "torchft")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    in_function: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    found = {}
    for top in FLOORS:
        paths = [REPO / f"{top}.py"] if (REPO / f"{top}.py").is_file() else sorted((REPO / top).rglob("*.py"))
        for path in paths:
            found[module_name(path)] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _imported_names(node: ast.Import | ast.ImportFrom, source: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: resolve against the importing module's package
        package = source.split(".") if is_package else source.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def edges_of(source: str, path: Path, modules: dict[str, Path]) -> tuple[list[Edge], set[str]]:
    """The module's edges into the project, and the external packages it imports at its top."""
    tree = ast.parse(path.read_text(), filename=str(path))
    in_functions = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                    for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    edges: set[Edge] = set()
    external: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        for name in _imported_names(node, source, path.name == "__init__.py"):
            target = _resolve(name, modules)
            if target is None:
                if id(node) not in in_functions and name:
                    external.add(name)
            elif target != source:
                edges.add(Edge(source, target, node.lineno, id(node) in in_functions))
    return sorted(edges, key=lambda e: (e.line, e.target)), external


def graph() -> tuple[list[Edge], dict[str, set[str]]]:
    modules = project_modules()
    edges: list[Edge] = []
    externals: dict[str, set[str]] = {}
    for name, path in modules.items():
        found, external = edges_of(name, path, modules)
        edges += found
        externals[name] = external
    return edges, externals


def floor(module: str) -> int:
    return FLOORS[module.split(".")[0]]


def find_cycle(edges: list[Edge]) -> list[str] | None:
    succ: dict[str, set[str]] = {}
    for e in edges:
        succ.setdefault(e.source, set()).add(e.target)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(succ.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(succ):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_graph_is_read() -> None:
    """The reader sees the edges it must (guards the other tests against reading nothing)."""
    edges, externals = graph()
    pairs = {(e.source, e.target) for e in edges}
    assert ("engine.rank.trainer", "engine.plan") in pairs
    assert ("dist_algos.allreduce", "dist_algos.base") in pairs
    assert "torch" in externals["core.distenv"]
    assert find_cycle([Edge("a", "b", 1, False), Edge("b", "c", 1, True), Edge("c", "a", 1, False)]) == ["a", "b", "c", "a"]


def test_no_import_cycle() -> None:
    edges, _ = graph()
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_runs_up_a_floor_or_across_the_middle_floor() -> None:
    edges, _ = graph()
    wrong = [f"{e.source}:{e.line} imports {e.target}" for e in edges
             if floor(e.target) > floor(e.source)
             or (floor(e.source) == floor(e.target) == 1 and e.source.split(".")[0] != e.target.split(".")[0])]
    assert not wrong, "\n".join(wrong)


def test_in_function_imports_only_defer_heavy_optional_dependencies() -> None:
    edges, externals = graph()
    heavy = {m for m, ext in externals.items() if any(x == h or x.startswith(h + ".") for x in ext for h in HEAVY_OPTIONAL)}
    wrong = [f"{e.source}:{e.line} imports {e.target} inside a function" for e in edges
             if e.in_function and e.target not in heavy]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("module", ["core", "data", "models", "dist_algos"])
def test_lower_floors_import_no_runner(module: str) -> None:
    edges, _ = graph()
    assert not [e for e in edges if e.source.split(".")[0] == module and floor(e.target) >= 2]
