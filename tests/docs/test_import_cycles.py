"""No import cycle among gpuready's own modules, the stand-ins (testbed) included.

A cycle makes the import order matter (whichever module is imported first sees the other half
initialised) and ties two modules so that neither can be read, tested or moved alone. The import
linter's layers contracts catch some, but only inside the containers they name; this test covers
every module of dra_driver, kubelet_plugin, controller, testbed and proto.

The graph comes from the source (``ast``; nothing is imported), from every import statement:

- imports inside functions and under ``if TYPE_CHECKING:`` count: a function-level import is a
  cycle put off until the call, and a type-only one still ties the two modules together;
- relative imports are resolved, and ``from pkg import name`` imports ``pkg.name`` when that is a
  module, ``pkg`` otherwise;
- importing ``a.b.c`` also imports the packages ``a`` and ``a.b`` (their ``__init__`` runs first),
  except those that are packages of the importer itself: they are already loaded before it runs;
- a submodule's imports are its own: ``a.b.c`` importing ``x`` does not make package ``a.b`` import ``x``.

Dynamic imports (``importlib.import_module``, entry points) are not statements and are not counted.
"""

from __future__ import annotations

import ast
import itertools
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dra_driver", "kubelet_plugin", "controller", "testbed", "proto")

# importer -> {imported module -> (file, line) of the first statement that imports it}
Graph = dict[str, dict[str, tuple[str, int]]]


def find_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Every module under ``packages`` by dotted name; a package is named by its ``__init__.py``."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _packages_of(name: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b"]``: the packages Python imports before ``a.b.c``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _named_modules(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool,
                   known: dict[str, Path]) -> list[str]:
    """The modules one import statement names (before adding the packages they sit in)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        # ``from . import x`` in a package's __init__ is relative to the package itself.
        base = importer.split(".") if is_package else importer.split(".")[:-1]
        if node.level > 1:
            base = base[: len(base) - (node.level - 1)]
        module = ".".join([*base, node.module] if node.module else base)
    else:
        module = node.module or ""
    named = []
    for alias in node.names:
        submodule = f"{module}.{alias.name}"
        named.append(submodule if submodule in known else module)
    return named


def build_graph(root: Path, packages: tuple[str, ...]) -> Graph:
    """The import graph among the modules under ``packages`` (module docstring: what counts)."""
    known = find_modules(root, packages)
    graph: Graph = {}
    for importer, path in known.items():
        is_package = path.name == "__init__.py"
        # An importer's own packages are loaded before it runs: importing them again on the way
        # to a sibling is no dependency. Named explicitly (``from pkg import Thing``) they are one.
        own_packages = set(_packages_of(importer))
        edges: dict[str, tuple[str, int]] = {}
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for named in _named_modules(node, importer, is_package, known):
                implied = [p for p in _packages_of(named) if p not in own_packages]
                for target in [*implied, named]:
                    if target in known and target != importer:
                        edges.setdefault(target, (str(path.relative_to(root)), node.lineno))
        graph[importer] = edges
    return graph


def strongly_connected(graph: Graph) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def _shortest_path(graph: Graph, start: str, goal: str, within: set[str]) -> list[str]:
    previous: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            path: list[str] = []
            at: str | None = node
            while at is not None:
                path.append(at)
                at = previous[at]
            return path[::-1]
        for target in sorted(graph[node]):
            if target in within and target not in previous:
                previous[target] = node
                queue.append(target)
    raise AssertionError(f"{goal} is not reachable from {start} inside its component")


def find_cycles(graph: Graph) -> list[list[str]]:
    """Cycles as paths (``[a, b, a]``): the shortest through each import edge inside a cycle, so
    every arrow that takes part in one shows up in at least one path, without listing them all."""
    cycles: list[list[str]] = []
    for component in strongly_connected(graph):
        members = set(component)
        covered: set[tuple[str, str]] = set()
        for source in component:
            for target in sorted(graph[source]):
                if target not in members or (source, target) in covered:
                    continue
                cycle = [source, *_shortest_path(graph, target, source, members)]
                covered.update(itertools.pairwise(cycle))
                cycles.append(cycle)
    return cycles


def describe(graph: Graph, cycles: list[list[str]]) -> str:
    """Each cycle as ``a -> b -> a``, then the statement behind each arrow."""
    lines = [f"{len(cycles)} import cycle(s) among gpuready's modules. Break each at one arrow: move the "
             "shared piece into a module both sides can import (a small types module), or pass a "
             "callable in; an import moved into a function still counts."]
    for cycle in cycles:
        lines.append("  " + " -> ".join(cycle))
        for source, target in itertools.pairwise(cycle):
            file, line = graph[source][target]
            lines.append(f"      {file}:{line} imports {target}")
    return "\n".join(lines)


def test_no_import_cycle_among_the_projects_modules() -> None:
    graph = build_graph(ROOT, PACKAGES)
    cycles = find_cycles(graph)
    assert not cycles, describe(graph, cycles)


def test_the_graph_sees_the_whole_project() -> None:
    # A walk that found nothing would pass the test above trivially.
    graph = build_graph(ROOT, PACKAGES)
    assert {name.split(".")[0] for name in graph} == set(PACKAGES)
    assert "testbed.apiserver.store" in graph["testbed.apiserver.server"]
    assert "dra_driver.logs" in graph["controller.daemon"]


# The rules, on a small package written for each case.

def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _edges(tmp_path: Path, files: dict[str, str]) -> dict[str, set[str]]:
    _write(tmp_path, files)
    return {k: set(v) for k, v in build_graph(tmp_path, ("pkg", "other")).items()}


def test_imports_inside_functions_and_type_checking_blocks_count(tmp_path: Path) -> None:
    edges = _edges(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "def f():\n    import pkg.b\n",
        "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import C\n",
        "pkg/c.py": "",
    })
    assert edges["pkg.a"] == {"pkg.b"}
    assert edges["pkg.b"] == {"pkg.c"}


def test_relative_imports_resolve_against_the_importers_package(tmp_path: Path) -> None:
    edges = _edges(tmp_path, {
        "pkg/__init__.py": "from . import sub\nfrom .sub import x\n",
        "pkg/sub/__init__.py": "from .x import X\nfrom .. import top\n",
        "pkg/sub/x.py": "from ..top import T\nfrom . import y\n",
        "pkg/sub/y.py": "",
        "pkg/top.py": "",
    })
    assert edges["pkg"] == {"pkg.sub", "pkg.sub.x"}
    assert edges["pkg.sub"] == {"pkg.sub.x", "pkg.top"}
    assert edges["pkg.sub.x"] == {"pkg.top", "pkg.sub.y"}


def test_importing_a_submodule_imports_the_packages_above_it(tmp_path: Path) -> None:
    edges = _edges(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "",
        "pkg/sub/mod.py": "",
        "other/__init__.py": "",
        "other/a.py": "import pkg.sub.mod\n",
        "other/b.py": "from pkg.sub import mod\n",
        "other/c.py": "from pkg.sub import Thing\n",
    })
    assert edges["other.a"] == edges["other.b"] == {"pkg", "pkg.sub", "pkg.sub.mod"}
    assert edges["other.c"] == {"pkg", "pkg.sub"}


def test_a_submodules_imports_are_not_its_packages(tmp_path: Path) -> None:
    edges = _edges(tmp_path, {
        "pkg/__init__.py": "from pkg import a\n",
        "pkg/a.py": "from pkg import b\nimport other.x\n",
        "pkg/b.py": "",
        "other/__init__.py": "",
        "other/x.py": "",
    })
    # pkg.a reaching pkg.b goes through pkg, which is already loaded: no pkg.a -> pkg edge, no cycle.
    assert edges["pkg"] == {"pkg.a"}
    assert edges["pkg.a"] == {"pkg.b", "other", "other.x"}
    assert find_cycles(build_graph(tmp_path, ("pkg", "other"))) == []


def test_a_cycle_is_reported_as_a_path_with_the_statements_behind_it(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "from pkg.a import A\n",
        "pkg/a.py": "from pkg.b import B\n",
        "pkg/b.py": "def f():\n    from pkg import A\n",  # the package itself, named: a real edge
        "pkg/c.py": "import pkg.d\n",
        "pkg/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import C\n",
    })
    graph = build_graph(tmp_path, ("pkg",))
    cycles = find_cycles(graph)
    assert cycles == [["pkg", "pkg.a", "pkg.b", "pkg"], ["pkg.c", "pkg.d", "pkg.c"]]
    report = describe(graph, cycles)
    assert "pkg -> pkg.a -> pkg.b -> pkg" in report
    assert "pkg/b.py:2 imports pkg" in report

