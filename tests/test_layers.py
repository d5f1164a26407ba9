"""The layers keep to their rooms: the import contracts in pyproject.toml hold (fronts over the domains over the
ground floor, ``runners/``, over ``core/``), no llamaforge module takes part in an import cycle, only
``runners/`` talks to the Docker engine, and the fronts (MCP server included) start no processes of their own."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

import llamaforge

pytestmark = pytest.mark.quick

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "llamaforge"


def _imports(path: Path) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
    return found


def test_only_runners_import_the_docker_sdk() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line}"
        for path in sorted([*PACKAGE.rglob("*.py"), *(REPO / "mcp_server").rglob("*.py")])
        if PACKAGE / "runners" not in path.parents
        for module, line in _imports(path)
        if module.split(".")[0] == "docker"
    ]
    assert offenders == [], "reach the Docker engine through llamaforge.runners (engine.py, container.py)"


def test_the_mcp_server_starts_no_processes() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line}"
        for path in sorted(
            [*(PACKAGE / "fronts" / "mcp").rglob("*.py"), *(REPO / "mcp_server").rglob("*.py")]
        )
        for module, line in _imports(path)
        if module.split(".")[0] in {"subprocess", "pty", "multiprocessing"}
    ]
    assert offenders == [], "start processes through llamaforge.runners.process"


def test_every_domain_module_is_in_a_subpackage() -> None:
    flat = sorted(path.name for path in PACKAGE.glob("*.py") if path.name != "__init__.py")
    assert flat == [], f"modules belong to a stage of the pipeline (core, build, models, …): {flat}"


def _import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm, without recursion);
    grimp counts imports inside functions and under TYPE_CHECKING too."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[module] = min(low[module], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return sorted(cycles)


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for name in ("a", "a.b", "a.c", "a.d", "a.e"):
        graph.add_module(name)
    graph.add_import(importer="a.b", imported="a.c")
    graph.add_import(importer="a.c", imported="a.d")
    graph.add_import(importer="a.d", imported="a.b")
    graph.add_import(importer="a.e", imported="a.b")
    assert _import_cycles(graph) == [["a.b", "a.c", "a.d"]]


def test_no_llamaforge_module_takes_part_in_an_import_cycle() -> None:
    assert Path(llamaforge.__file__).parent == PACKAGE, "run the tests against this checkout's src/"
    graph = grimp.build_graph("llamaforge")
    cycles = _import_cycles(graph)
    shown = []
    for cycle in cycles:
        there = graph.find_shortest_chain(cycle[0], cycle[1]) or ()
        back = graph.find_shortest_chain(cycle[1], cycle[0]) or ()
        shown.append(" -> ".join([*there, *back[1:]]) + f"  ({len(cycle)} modules in the cycle)")
    assert cycles == [], "import cycles among llamaforge's modules:\n" + "\n".join(shown)


def test_the_import_contracts_hold() -> None:
    """``lint-imports`` with the contracts of pyproject.toml: the layers, strict, with nothing ignored."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    assert lint_imports.is_file(), "install the test extra: pip install -e '.[test]' (import-linter)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [str(lint_imports), "--no-cache"],  # reads pyproject.toml in cwd
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
