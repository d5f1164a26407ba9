"""The layers keep to their rooms: only ``runners/`` talks to the Docker engine, and the fronts (MCP server
included) start no processes of their own."""

from __future__ import annotations

import ast
from pathlib import Path

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
        if path.parent != PACKAGE / "runners"
        for module, line in _imports(path)
        if module.split(".")[0] == "docker"
    ]
    assert offenders == [], "reach the Docker engine through llamaforge.runners (engine.py, docker.py)"


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
