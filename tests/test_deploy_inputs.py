"""Values that reach a deployment's unit file, its scripts (run as root) and `install -d -o` are checked before
anything is rendered or any host is reached: the deployment root and the KV cache type. A newline, a shell
substitution or a system tree is refused naming the option, from the core and from the CLI alike."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from llamaforge.core.errors import InvalidOption
from llamaforge.deploy.hosts.ops import DeployParams
from llamaforge.deploy.release import DEFAULT_ROOT, Layout

pytestmark = pytest.mark.quick

HOSTILE_ROOTS = [
    "/opt/lf\nExecStartPre=+/bin/sh -c id",  # a newline adds a unit directive run as root
    "/opt/lf$(id)",
    "/opt/lf`id`",
    "/opt/lf;id",
    "/opt/lf\n",  # a trailing newline, which `$` in a pattern would let through
    "/opt/lf%n",
    "/opt/lf\\x",
    "/opt/../etc",
    "opt/relative",
    "/",
    "/etc",
    "/usr/lib",
    "/var",
]


@pytest.mark.parametrize("root", HOSTILE_ROOTS)
def test_hostile_or_system_roots_are_refused(root: str) -> None:
    with pytest.raises(InvalidOption) as caught:
        Layout("default", root)
    assert "--root" in caught.value.message and DEFAULT_ROOT in (caught.value.hint or "")
    with pytest.raises(
        ValidationError
    ) as early:  # refused as the options are read, before anything is looked up
        DeployParams(hosts="lf@127.0.0.1:22", build="k", root=root)
    assert "is not a directory a deployment may live in" in str(early.value)


@pytest.mark.parametrize(
    ("root", "name"), [("/", "etc"), ("/usr", "bin"), ("/var", "lib"), ("/usr/local", "bin")]
)
def test_a_root_and_name_that_make_a_system_directory_are_refused(root: str, name: str) -> None:
    with pytest.raises(InvalidOption):
        Layout(name, root)


@pytest.mark.parametrize(
    ("root", "name"), [(DEFAULT_ROOT, "default"), ("/srv", "llm"), ("/var/lib/lf", "qwen3")]
)
def test_ordinary_roots_are_kept(root: str, name: str) -> None:
    assert Layout(name, root).root == f"{root}/{name}"


@pytest.mark.parametrize("cache_type", ["q8_0\nExecStartPre=+/bin/sh", "q8_0 --rpc 10.0.0.1:1", "fp8"])
def test_unknown_cache_types_are_refused(cache_type: str) -> None:
    with pytest.raises(ValidationError) as caught:
        DeployParams(hosts="lf@127.0.0.1:22", build="k", model="tiny", cache_type=cache_type)
    assert "is not a KV cache type llama.cpp knows" in str(caught.value)
    assert (
        DeployParams(hosts="lf@127.0.0.1:22", build="k", model="tiny", cache_type="q8_0").cache_type == "q8_0"
    )


def test_the_cli_refuses_a_newline_in_root_before_rendering(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "invoke",
            "deploy.render",
            "--target",
            "systemd",
            "--build",
            "none",
            "--root",
            "/opt/x\nExecStartPre=+/bin/sh",
            "--model",
            str(tmp_path / "m.gguf"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[1],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LLAMAFORGE_HOME": str(tmp_path / "home")},
    )
    assert out.returncode == InvalidOption.exit_code, out.stderr
    assert "Traceback" not in out.stderr and "ExecStartPre" not in out.stdout
