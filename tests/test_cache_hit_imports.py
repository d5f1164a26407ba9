"""A cache hit through `invoke build` imports only what it needs: the fronts' registry, the plan and the store
lookup. The heavy libraries (the docker SDK, numpy, matplotlib, the MCP SDK, the GGUF readers, rich's tables)
load only when an operation or a renderer that uses them runs. Checked on module sets, in fresh interpreters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[1]

# Packages (and the few submodules named) a cache hit must not import: llamaforge's GGUF reader too.
HEAVY = (
    "docker",
    "paramiko",
    "numpy",
    "matplotlib",
    "mcp",
    "gguf",
    "filelock",
    "rich.syntax",
    "rich.table",
    "llamaforge.gguf",
)


def loaded_after(code: str, home: Path | None = None) -> set[str]:
    """The module names a fresh interpreter holds after running ``code`` in the repository root (with
    ``LLAMAFORGE_HOME=home`` when given)."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, **({"LLAMAFORGE_HOME": str(home)} if home else {})}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def operation_modules(modules: set[str]) -> set[str]:
    return {
        name for name in modules if name.startswith("llamaforge.") and name.rsplit(".", 1)[-1][:3] == "ops"
    }


def heavy_in(modules: set[str]) -> list[str]:
    return sorted(name for name in HEAVY if name in modules)


def test_importing_tasks_loads_no_heavy_library(tmp_path: Path) -> None:
    # The first run has no index yet: it imports every operation to make it ...
    first = loaded_after("import tasks", tmp_path)
    assert heavy_in(first) == []
    assert {"llamaforge.build.ops", "llamaforge.smoke.ops", "llamaforge.models.ops_fit"} <= first
    # ... but no renderer module is imported until a result is shown.
    assert not {name for name in first if name.startswith("llamaforge.") and name.endswith(".render")}
    # Later runs read the index and import no operation at all.
    later = loaded_after("import tasks", tmp_path)
    assert heavy_in(later) == []
    assert operation_modules(later) == set()
    assert "llamaforge.fronts.cli_index" in later


def test_running_one_task_imports_only_its_operation(tmp_path: Path) -> None:
    loaded_after("import tasks", tmp_path)  # makes the index
    modules = loaded_after(
        "import tasks\n"
        "from llamaforge.fronts.cli_index import operation_index\n"
        "assert operation_index()['build'].load().name == 'build'",
        tmp_path,
    )
    assert operation_modules(modules) == {"llamaforge.build.ops"}


def test_the_cache_hit_path_loads_no_heavy_library(tmp_path: Path) -> None:
    """Everything a cache hit runs before it asks the engine for the builder image id: the plan, the
    executor, the build-and-store modules. The first plan renders the build files with Jinja; later ones
    read them from the cache and import no Jinja."""
    code = (
        "import tasks\n"
        "from llamaforge.build.ops import BuildParams, _plan_from_params\n"
        "from llamaforge.build import execute, store\n"
        "from llamaforge.build.executors import make_executor\n"
        "_plan_from_params(BuildParams(backend='cpu'))\n"
        "make_executor('docker', {})\n"
    )
    first = loaded_after(code, tmp_path)
    assert {"llamaforge.build.execute", "llamaforge.build.executors.docker", "jinja2"} <= first
    modules = loaded_after(code, tmp_path)
    assert {"llamaforge.build.execute", "llamaforge.build.executors.docker"} <= modules
    assert heavy_in(modules) == []
    assert not {"jinja2", "markupsafe"} & modules
    # The operations around a build (builds.*, doctor, recipes.*) and what they use stay out of it.
    assert not {"llamaforge.build.ops_store", "llamaforge.build.doctor", "llamaforge.build.images"} & modules


def test_a_hit_through_invoke_writes_bytecode_unless_python_is_told_not_to(tmp_path: Path) -> None:
    """Invoke turns bytecode writing off before it imports tasks.py; tasks.py gives the decision back to
    Python's own switch, so a checkout's modules are compiled once, not on every run."""
    probe = "import sys\nsys.dont_write_bytecode = True  # as invoke leaves it\nimport tasks\n"
    probe += "print(sys.dont_write_bytecode)"
    for env, expected in (({}, "False"), ({"PYTHONDONTWRITEBYTECODE": "1"}, "True")):
        base = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
        base["LLAMAFORGE_HOME"] = str(tmp_path)
        done = subprocess.run(
            [sys.executable, "-c", probe],
            cwd=ROOT,
            env={**base, **env},
            capture_output=True,
            text=True,
            check=True,
        )
        assert done.stdout.splitlines()[-1] == expected, env


def test_a_result_shown_to_a_person_imports_only_its_operation(tmp_path: Path) -> None:
    """Without --json the CLI prints the operation's own renderer, found on the operation it ran: no lookup in
    the registry (which would import every operation), and a cache hit's table needs no pygments."""
    loaded_after("import tasks", tmp_path)  # makes the index
    shown = loaded_after(
        "import tasks\n"
        "from llamaforge.fronts.cli import run_operation\n"
        "from llamaforge.fronts.cli_index import operation_index\n"
        "assert run_operation(operation_index()['recipes.list'].load(), {}, as_json=False, verbose=False) == 0",
        tmp_path,
    )
    assert operation_modules(shown) == {"llamaforge.build.ops_store"}
    hit = {
        "dry_run": False,
        "build": {
            "key": "k",
            "path": "p",
            "cached": True,
            "seconds": 0.1,
            "artifacts": {"bin/llama-cli": {"size": 1, "sha256": "0" * 64}},
        },
    }
    shown = loaded_after(
        "import io, tasks\n"
        "from rich.console import Console\n"
        "from llamaforge.fronts.cli_index import operation_index\n"
        "from llamaforge.fronts.render_cli import render_result\n"
        "op = operation_index()['build'].load()\n"
        f"render_result(op, op.result.model_validate({hit!r}), Console(file=io.StringIO()))",
        tmp_path,
    )
    assert operation_modules(shown) == {"llamaforge.build.ops"}
    assert "llamaforge.build.render" in shown
    assert not {"rich.syntax", "pygments"} & shown


def test_a_renderer_is_imported_when_a_result_is_shown() -> None:
    modules = loaded_after(
        "from llamaforge.core.registry import operations\nassert operations()['build'].render_cli is not None"
    )
    assert "llamaforge.build.render" in modules


@pytest.mark.docker
def test_image_ids_without_the_sdk_are_the_sdks(docker_engine: object) -> None:
    """The cache key's builder image id, looked up on the engine socket without the SDK, is the SDK's id;
    a missing image is None for both."""
    from llamaforge.build.images import DEFAULT_TAG

    probe = (
        "import json, sys\n"
        "from llamaforge.runners.engine import image_id\n"
        f"ids = [image_id({DEFAULT_TAG!r}), image_id('llamaforge/no-such-image:never')]\n"
        "print(json.dumps({'ids': ids, 'sdk': 'docker' in sys.modules}))"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    socket_side = json.loads(done.stdout)
    assert socket_side["sdk"] is False
    sdk_id = str(docker_engine.images.get(DEFAULT_TAG).id)  # type: ignore[attr-defined]
    assert socket_side["ids"] == [sdk_id, None]
