"""The tier rules hold: a test file without a tier, or a quick test that needs Docker, stops collection naming it;
`--tier` selects by the heaviest marker; `--suite-times` records phases and fixtures; the profile reads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

pytestmark = pytest.mark.quick

INI = """[pytest]
markers =
    quick: unit
    llamacpp: llama.cpp
    docker: Docker
    cuda_toolkit: CUDA
    slow: slow
"""
CONFTEST = """
import pytest
pytest_plugins = ("tiers", "suite_times")

@pytest.fixture(scope="session")
def docker_engine():
    return object()

@pytest.fixture(scope="session")
def made_once():
    import time
    time.sleep(0.3)
    return 1
"""


def _pytest(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # Not as an xdist worker of the suite: the inner run would take itself for one (its times file, its home).
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_XDIST")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=directory,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _project(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_a_file_without_a_tier_stops_collection_naming_it(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        {
            "test_named.py": "import pytest\npytestmark = pytest.mark.quick\ndef test_a():\n    pass\n",
            "test_unnamed.py": "def test_b():\n    pass\n",
        },
    )
    result = _pytest(project, "--collect-only", "-q")
    assert result.returncode == 4, result.stdout + result.stderr
    assert "test_unnamed.py: no tier" in result.stderr
    assert "test_named.py" not in result.stderr


def test_a_quick_test_that_needs_docker_stops_collection(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        {
            "test_x.py": (
                "import pytest\npytestmark = pytest.mark.quick\n"
                "def test_engine(docker_engine):\n    pass\n"
                "@pytest.mark.docker\ndef test_marked(docker_engine):\n    pass\n"
            )
        },
    )
    result = _pytest(project, "--collect-only", "-q")
    assert result.returncode == 4
    assert "test_x.py::test_engine (uses docker_engine): in the quick tier" in result.stderr
    assert "test_marked" not in result.stderr


def test_tier_selects_by_the_heaviest_marker(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        {
            "test_mixed.py": (
                "import pytest\npytestmark = pytest.mark.quick\n"
                "def test_unit():\n    pass\n"
                "@pytest.mark.docker\n@pytest.mark.llamacpp\ndef test_build():\n    pass\n"
                "@pytest.mark.llamacpp\ndef test_source():\n    pass\n"
            )
        },
    )
    quick = _pytest(project, "--tier", "quick", "-q")
    assert quick.returncode == 0 and "1 passed, 2 deselected" in quick.stdout, quick.stdout
    docker = _pytest(project, "--tier", "docker", "--tier", "llamacpp", "-q")
    assert "2 passed, 1 deselected" in docker.stdout, docker.stdout
    bad = _pytest(project, "--tier", "fast")
    assert bad.returncode == 4 and "invalid choice: 'fast'" in bad.stderr


def test_lanes_run_side_by_side_on_two_workers(tmp_path: Path) -> None:
    """Under `-n 2 --dist loadgroup` the build lane and the host lane each run whole on one worker, not the same
    one, and the quick tests on either."""
    heavy = "import pytest\npytestmark = pytest.mark.quick\n" + "".join(
        f"@pytest.mark.docker\ndef test_{n}():\n    pass\n" for n in range(4)
    )
    quick = "import pytest\npytestmark = pytest.mark.quick\n" + "".join(
        f"def test_{n}():\n    pass\n" for n in range(6)
    )
    project = _project(
        tmp_path, {"test_build_x.py": heavy, "test_deploy_ssh.py": heavy, "test_unit.py": quick}
    )
    out = tmp_path / "times.json"
    result = _pytest(project, "-n", "2", "--dist", "loadgroup", "--suite-times", str(out), "-q")
    assert result.returncode == 0 and "14 passed" in result.stdout, result.stdout + result.stderr
    tests = json.loads(out.read_text())["tests"]
    assert not list(tmp_path.glob("times.json.gw*"))  # the workers' parts are merged and gone
    build = {tests[f"test_build_x.py::test_{n}"]["worker"] for n in range(4)}
    hosts = {tests[f"test_deploy_ssh.py::test_{n}"]["worker"] for n in range(4)}
    assert len(build) == 1 and len(hosts) == 1 and build != hosts, (build, hosts)
    assert {tests[f"test_unit.py::test_{n}"]["worker"] for n in range(6)} <= {"gw0", "gw1"}


def test_suite_times_records_phases_fixtures_and_tiers(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        {
            "test_t.py": (
                "import pytest, time\npytestmark = pytest.mark.quick\n"
                "def test_one(made_once):\n    time.sleep(0.2)\n"
                "def test_two(made_once):\n    pass\n"
                "@pytest.mark.docker\ndef test_three():\n    pytest.skip('no engine')\n"
                "def test_four():\n    assert False\n"
            )
        },
    )
    out = tmp_path / "times.json"
    result = _pytest(project, "--suite-times", str(out), "-q")
    assert result.returncode == 1  # test_four fails on purpose
    data = json.loads(out.read_text())
    tests = data["tests"]
    assert tests["test_t.py::test_one"]["call"] >= 0.2
    assert tests["test_t.py::test_one"]["setup"] >= 0.3  # the session fixture's time lands on its first user
    assert tests["test_t.py::test_two"]["setup"] < 0.3
    assert tests["test_t.py::test_three"]["outcome"] == "skipped"
    assert tests["test_t.py::test_three"]["tier"] == "docker"
    assert tests["test_t.py::test_four"]["outcome"] == "failed"
    (fixture,) = [entry for entry in data["fixtures"] if entry["name"] == "made_once"]
    assert fixture["scope"] == "session" and fixture["seconds"] >= 0.3
    assert fixture["test"] == "test_t.py::test_one"
    assert data["wall_s"] > 0 and "cpu:" in data["cpu"]

    profile = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "suite_time.py"),
            str(out),
            str(out),
            "--labels",
            "cold,warm",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    text = profile.stdout
    assert "cold:" in text and "warm:" in text and "1 failed, 2 passed, 1 skipped" in text
    assert "by tier" in text and "quick" in text and "docker" in text
    assert "made_once (session), for test_t.py::test_one" in text
    assert "test_t.py" in text.split("by file", 1)[1]


def test_the_profile_reads_junit_xml(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        {"test_j.py": "import pytest\npytestmark = pytest.mark.quick\ndef test_a():\n    pass\n"},
    )
    xml = tmp_path / "run.xml"
    _pytest(project, f"--junitxml={xml}", "-q")
    profile = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "suite_time.py"), str(xml)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "test_j.py" in profile.stdout and "1 passed" in profile.stdout
    missing = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "suite_time.py"), str(tmp_path / "nope.json")],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "no such file" in missing.stderr
