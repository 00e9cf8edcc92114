"""The frame of the house: the project's import graph has no cycle and no import running up a floor.

Floors, from the ground up: `core` (imports nothing of the project); `data`, `models`,
`dist_algos` (import `core` only, not each other); `engine`, the runner (imports the floors
below); `cli.py` and `bench/` on top. The graph is read with `ast` from every module, imports
inside functions included (an import hidden in a function to dodge a cycle is still an edge).
An import of the project's own module inside a function is allowed only where it defers a heavy
optional dependency: the imported module itself imports one of HEAVY_OPTIONAL at its top.

Inside a package the same holds one level down (INNER_FLOORS): its modules, grouped by prefix,
stand on floors of their own, none imports up, and groups named apart (INNER_APART) never import
each other though they share a floor. No module imports another's `_private` name.
"""
from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FLOORS = {"core": 0, "data": 1, "models": 1, "dist_algos": 1, "engine": 2, "projection": 3, "tables": 4, "cli": 5,
          "bench": 5}
#: packages too heavy, or too rarely needed, to import before they are chosen
HEAVY_OPTIONAL = ("ffcv", "nvidia.dali", "wandb", "matplotlib", "submitit", "deepspeed", "numba", "torchft",
                  "pyarrow")  # pyarrow: the tables' sealed stores (0.4 s on every cli.py start otherwise)
#: Floors inside a package, lowest first, each a group of module prefixes: a prefix names a module
#: and the modules under it, and the longest prefix naming a module places it. An import inside
#: the package stays in its group or goes down.
INNER_FLOORS: dict[str, list[tuple[str, ...]]] = {
    "data": [
        # what a data set is made of: the section, sharding, the trainer's streams, the forms samples
        # take, on-device augmentation, MNIST-1D's generator, text, the validation split
        ("data.config", "data.sampler", "data.stream", "data.prefetch", "data.device_augment",
         "data.ffcv_augment", "data.mnist1d_generator", "data.samples", "data.text", "data.split"),
        ("data.sets",),  # one file per data set
        ("data.prepared_files", "data.pipelines"),  # what reads the sets: prepared files, the pipelines
        ("data", "data.prepare"),  # what the runner imports, and `python -m data.prepare`
    ],
    "dist_algos": [
        ("dist_algos.comm",),  # how plugins communicate: accounting, flat buffers, buckets, p2p, rounds
        ("dist_algos.consensus", "dist_algos.schedules"),  # the consensus model; when and with whom
        ("dist_algos.compress",),  # compression, usable without the plugin contract
        ("dist_algos.base",),  # the plugin contract
        ("dist_algos.param_server.layout", "dist_algos.param_server.wire",  # the parameter-server base
         "dist_algos.param_server.server", "dist_algos.param_server.traffic", "dist_algos.param_server.plugin"),
        ("dist_algos", "dist_algos.param_server"),  # the registry and the plugins
    ],
    "engine": [
        # the parts and their config sections: checkpoint format, reports, the trainer's
        # components, what the plan reads of launching (section, hostfile, network, commands, start),
        # the `ft` section, usage
        ("engine.checkpoint", "engine.report", "engine.train", "engine.launch.config", "engine.launch.hostfile",
         "engine.launch.network", "engine.launch.node_group", "engine.launch.procs", "engine.launch.remote",
         "engine.launch.commands", "engine.launch.start", "engine.ft", "engine.ft.config", "engine.usage"),
        ("engine.config",),  # the run's sections together
        ("engine.plan",),  # what is decided before training
        # inside a rank | in the launching process | a command reading a finished run
        ("engine.rank", "engine.ft.rank", "engine.launch", "engine.ft.launch", "engine.worker_spread"),
    ],
    "projection": [
        ("projection.config", "projection.collectives", "projection.compute"),  # the section; closed forms; compute
        ("projection.cluster",),  # a preset: the system
        ("projection.network", "projection.workload", "projection.ledger_view"),  # links; the workload; a ledger
        ("projection.recurrence", "projection.calibration", "projection.simgrid_run"),  # the engines' halves; the fit
        ("projection.events",),  # discrete events (the SimGrid child's parent side)
        ("projection.engine",),  # one projection with its band
        ("projection", "projection.run_inputs", "projection.command"),  # `python cli.py project.run=DIR`
    ],
}
#: groups on one floor of a package that never import each other (they meet in the run directory)
INNER_APART: dict[str, list[tuple[str, str]]] = {
    "engine": [("engine.rank", "engine.launch"), ("engine.rank", "engine.ft.launch"),
               ("engine.ft.rank", "engine.launch"), ("engine.ft.rank", "engine.ft.launch")],
}


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


def _from_base(node: ast.ImportFrom, source: str, is_package: bool) -> str:
    """The module a `from ... import` names, relative imports resolved against the importer's package."""
    base = node.module or ""
    if node.level:
        package = source.split(".") if is_package else source.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    return base


def _imported_names(node: ast.Import | ast.ImportFrom, source: str, is_package: bool,
                    modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = _from_base(node, source, is_package)
    names = [f"{base}.{alias.name}" for alias in node.names]
    # `from package import module` needs the module, as `import package.module` does; the
    # package's own code only where a name comes from it
    return names if all(n in modules for n in names) else [base] + names


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
        for name in _imported_names(node, source, path.name == "__init__.py", modules):
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
    assert ("dist_algos.param_server.plugin", "dist_algos.param_server.wire") in pairs  # from package import module
    assert ("dist_algos.param_server.plugin", "dist_algos.param_server") not in pairs
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


def placing_prefix(module: str, groups: list[tuple[str, ...]]) -> str | None:
    """The longest prefix of INNER_FLOORS' groups that names `module`; None if none does."""
    placed = [prefix for prefixes in groups for prefix in prefixes
              if module == prefix or module.startswith(prefix + ".")]
    return max(placed, key=len) if placed else None


def inner_floor(module: str, groups: list[tuple[str, ...]]) -> int | None:
    """The group of INNER_FLOORS that places `module` (its longest matching prefix); None if none."""
    placed = [(len(prefix), level) for level, prefixes in enumerate(groups) for prefix in prefixes
              if module == prefix or module.startswith(prefix + ".")]
    return max(placed)[1] if placed else None


def upward_inside(edges: list[Edge], package: str, groups: list[tuple[str, ...]],
                  apart: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The imports between modules of `package` that run up its inner floors (or leave a module
    no group places), or join two groups kept `apart`."""
    wrong = []
    for e in edges:
        if e.source.split(".")[0] != package or e.target.split(".")[0] != package:
            continue
        low, high = inner_floor(e.source, groups), inner_floor(e.target, groups)
        if low is None or high is None:
            wrong.append(f"{e.source}:{e.line} imports {e.target}: place both in INNER_FLOORS[{package!r}]")
        elif high > low:
            wrong.append(f"{e.source}:{e.line} imports {e.target}, a floor up inside {package}/")
        else:
            ends = {placing_prefix(e.source, groups), placing_prefix(e.target, groups)}
            pair = next((p for p in apart if set(p) == ends), None)
            if pair is not None:
                wrong.append(f"{e.source}:{e.line} imports {e.target}: {placing_prefix(e.source, groups)} and "
                             f"{placing_prefix(e.target, groups)} are kept apart")
    return wrong


@pytest.mark.parametrize("package", sorted(INNER_FLOORS))
def test_no_import_runs_up_a_floor_inside_a_package(package: str) -> None:
    edges, _ = graph()
    wrong = upward_inside(edges, package, INNER_FLOORS[package], INNER_APART.get(package, []))
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("package", sorted(INNER_FLOORS))
def test_every_module_has_an_inner_floor(package: str) -> None:
    """A new folder or module inside the package is placed on a floor, not silently unchecked."""
    groups = INNER_FLOORS[package]
    unplaced = [m for m in project_modules() if m.split(".")[0] == package and m != package
                and inner_floor(m, groups) is None]
    assert not unplaced, f"place these in INNER_FLOORS[{package!r}]: {', '.join(sorted(unplaced))}"


def test_a_planted_upward_import_is_caught(tmp_path: Path) -> None:
    """A component that imports the plan, a plan that imports a driver, and a driver that imports
    the rank's code: each read from a planted module file, each reported."""
    modules = project_modules()
    planted = {"engine.train.planted": "from engine.plan import RunPlan\n",
               "engine.plan": "from engine.launch.loop import launch\n",  # (a planted version of it)
               "engine.launch.planted": "def f():\n    from engine.rank.trainer import Trainer\n"}
    edges: list[Edge] = []
    for name, text in planted.items():
        path = tmp_path / (name.replace(".", "_") + ".py")
        path.write_text(text)
        edges += edges_of(name, path, {**modules, name: path})[0]
    wrong = upward_inside(edges, "engine", INNER_FLOORS["engine"], INNER_APART["engine"])
    assert len(wrong) == 3, wrong
    assert "engine.train.planted:1 imports engine.plan, a floor up" in wrong[0]
    assert "engine.plan:1 imports engine.launch.loop, a floor up" in wrong[1]
    assert "engine.launch.planted:2 imports engine.rank.trainer: engine.launch and engine.rank are kept apart" \
        in wrong[2]
    # and nothing where the imports run down
    down = [Edge("engine.plan", "engine.train.optim", 1, False), Edge("engine.rank.trainer", "engine.plan", 1, False)]
    assert upward_inside(down, "engine", INNER_FLOORS["engine"], INNER_APART["engine"]) == []


def test_an_upward_import_planted_inside_dist_algos_is_caught(tmp_path: Path) -> None:
    """A helper that imports the plugin contract, and a compressor that imports the registry, are
    read from files like any module and caught; a plugin importing a helper is not."""
    modules = project_modules()
    groups = INNER_FLOORS["dist_algos"]
    planted = {"dist_algos.comm.planted": "from dist_algos.base import DistAlgorithm\n",
               "dist_algos.compress.planted": "from dist_algos import register_algorithm\n",
               "dist_algos.planted": "from dist_algos.comm import flat\n"}
    edges: list[Edge] = []
    for name, code in planted.items():
        path = tmp_path / f"{name}.py"
        path.write_text(code)
        edges += edges_of(name, path, modules)[0]
    assert upward_inside(edges, "dist_algos", groups) == [
        "dist_algos.comm.planted:1 imports dist_algos.base, a floor up inside dist_algos/",
        "dist_algos.compress.planted:1 imports dist_algos, a floor up inside dist_algos/"]
    assert inner_floor("dist_algos.param_server.dgs", groups) == inner_floor("dist_algos.allreduce", groups) == 5
    assert inner_floor("dist_algos.param_server.wire", groups) == 4


# ---- private names ------------------------------------------------------------------------------

def private_imports(modules: dict[str, Path]) -> set[tuple[str, str]]:
    """(importing module, name) for every `from x import _name` where x is a project module."""
    found = set()
    for source, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
                continue
            if _resolve(_from_base(node, source, path.name == "__init__.py"), modules) is None:
                continue
            found |= {(source, a.name) for a in node.names if a.name.startswith("_") and not a.name.startswith("__")}
    return found


def test_no_module_imports_another_modules_private_name() -> None:
    """A `_name` is its module's own; what another module needs is made public where it lives."""
    found = sorted(private_imports(project_modules()))
    assert not found, "\n".join(f"{m} imports {n}: make it public where it lives" for m, n in found)


def test_a_planted_private_import_is_caught(tmp_path: Path) -> None:
    modules = project_modules()
    path = tmp_path / "planted.py"
    path.write_text("from engine.launch.commands import REPO, free_port\nfrom os.path import _joinrealpath\n"
                    "from engine.launch.plans import LaunchPlan as _Plan\n"
                    "from engine.launch.loop import _job_manager_signal\n")
    assert private_imports({**modules, "engine.planted": path}) - private_imports(modules) == \
        {("engine.planted", "_job_manager_signal")}


# ---- room sizes ---------------------------------------------------------------------------------

#: the most lines a module may hold: past it, a module has more than one job (docs/architecture.md)
MAX_MODULE_LINES = 450


def test_no_module_is_over_the_size_of_one_job() -> None:
    """Every module of the project and of its tests stays at or under MAX_MODULE_LINES lines."""
    paths = list(project_modules().values()) + sorted((REPO / "tests").rglob("*.py"))
    over = sorted(f"{p.relative_to(REPO)}: {n} lines" for p in paths
                  if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES)
    assert not over, f"split these by job (at most {MAX_MODULE_LINES} lines each):\n" + "\n".join(over)
