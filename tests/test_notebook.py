"""examples/quickstart.ipynb runs top to bottom in a real kernel (nbclient) and shows what it promises.

Where a Docker engine and the llama.cpp sdist are there (always in CI), the suite's shared default CPU build is made
first, so the notebook's `%llamaforge build --backend cpu` is a cache hit in the same LLAMAFORGE_HOME; elsewhere the
notebook is told to skip that one cell.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import REPO

pytestmark = pytest.mark.quick

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = REPO / "examples" / "quickstart.ipynb"
CELL_TIMEOUT_S = 600  # a cold CPU build (no cache) takes ~7 minutes on 2 cores; a cache hit about a second


def _kernel_spec_dir(tmp_path: Path) -> Path:
    """A `python3` kernelspec for this interpreter, so the kernel sees the same llamaforge as the tests."""
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3 (llamaforge tests)",
                "language": "python",
            }
        ),
        encoding="utf-8",
    )
    return tmp_path / "jupyter"


def _outputs(cell: Any) -> str:
    """Every text and HTML output of a cell, joined."""
    parts: list[str] = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            parts.append(output["text"])
        for mime in ("text/html", "text/plain"):
            value = output.get("data", {}).get(mime)
            if value:
                parts.append(value if isinstance(value, str) else "".join(value))
    return "\n".join(parts)


def _cell(notebook: Any, marker: str) -> Any:
    matches = [cell for cell in notebook.cells if cell.cell_type == "code" and marker in cell.source]
    assert len(matches) == 1, f"expected one code cell with {marker!r}"
    return matches[0]


@pytest.fixture
def kernel_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The kernel's environment: the shared build's home when the build tier is available, else a private one."""
    env = {
        **os.environ,
        "JUPYTER_PATH": str(_kernel_spec_dir(tmp_path)),
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    }
    try:
        request.getfixturevalue("patched_build")  # the suite's one default CPU build
    except pytest.skip.Exception:  # no Docker engine or sdist here (outside CI): do not build in the notebook
        return {**env, "LLAMAFORGE_HOME": str(tmp_path / "home"), "LLAMAFORGE_NOTEBOOK_BUILD": "0"}
    build_env: dict[str, str] = request.getfixturevalue("build_env")
    shared = {name: build_env[name] for name in ("LLAMAFORGE_HOME", "LLAMAFORGE_SOURCE_MIRROR")}
    return {**env, **shared, "LLAMAFORGE_NOTEBOOK_BUILD": "1"}


@pytest.mark.filterwarnings(
    # jupyter_client/zmq and nbclient still call APIs that their dependencies deprecated; only theirs.
    "ignore::DeprecationWarning:jupyter_client.*",
    "ignore::DeprecationWarning:zmq.*",
    "ignore::DeprecationWarning:nbclient.*",
    "ignore::DeprecationWarning:jupyter_core.*",
)
@pytest.mark.docker  # the notebook runs doctor, which fails without a Docker engine
def test_quickstart_notebook_executes(kernel_env: dict[str, str]) -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=CELL_TIMEOUT_S,
        allow_errors=False,
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    started = time.monotonic()
    client.execute(env=kernel_env)  # raises CellExecutionError, with the cell and its error, on any failure
    print(f"quickstart.ipynb executed in {time.monotonic() - started:.1f} s")

    errors = [
        o for cell in notebook.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"
    ]
    assert not errors

    recipes = _outputs(_cell(notebook, "%llamaforge recipes.list"))
    assert "build recipes" in recipes and ">default<" in recipes
    plan = _outputs(_cell(notebook, "--arch 86 --dry-run"))
    assert "build plan (dry run)" in plan and "CMAKE_CUDA_ARCHITECTURES=86" in plan
    assert "-DCMAKE_CUDA_ARCHITECTURES=86" in _outputs(_cell(notebook, 'if "CUDA" in arg'))
    assert "this machine can build" in _outputs(_cell(notebook, "%llamaforge doctor"))
    assert "builds" in _outputs(_cell(notebook, "%llamaforge builds.list"))

    build = _outputs(_cell(notebook, "%llamaforge build --backend cpu"))
    if kernel_env["LLAMAFORGE_NOTEBOOK_BUILD"] == "1":
        assert "cache hit: True" in build and "bin/llama-server" in build
    else:
        assert "skipped the CPU build" in build

    mcp = _outputs(_cell(notebook, "stdio_client("))
    assert "read-only tools:" in mcp and "recipes_list" in mcp and "'default'" in mcp
    assert "build_start" not in mcp  # --read-only hides the tools that change state
