"""Shared fixtures. Tiers: unit tests always run; `docker`/`llamacpp` tests need a Docker engine and the
llama.cpp sdist. With LLAMAFORGE_TEST_STRICT=1 (CI) a missing prerequisite fails instead of skipping."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from engines import ExtraEngine
    from testhosts import TestHost

STRICT = os.environ.get("LLAMAFORGE_TEST_STRICT") == "1"

# Tiers (`--tier quick`; every file names its tier) and `--suite-times FILE` (benchmarks/suite_time.py).
pytest_plugins = ("tiers", "suite_times")

# A suite started in the background by a shell without job control (`cmd &` in a script) inherits SIGINT
# ignored, and so would every llamaforge it starts: the Ctrl-C tests would then test nothing. Take SIGINT back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_report_header(config: pytest.Config) -> str:
    """Which CPU the run had: what the llama.cpp tests exercise (the CPU module ggml loads, AMX or repacked
    buffers) depends on it, so a run says it."""
    from helpers import cpu_header

    cpuinfo = Path("/proc/cpuinfo")
    return cpu_header(cpuinfo.read_text(encoding="utf-8", errors="replace") if cpuinfo.is_file() else "")


def require(condition: bool, reason: str) -> None:
    """Skip (or fail, in strict mode) when a prerequisite of an integration test is missing."""
    if condition:
        return
    if STRICT:
        pytest.fail(f"prerequisite missing in strict mode: {reason}")
    pytest.skip(reason)


@pytest.fixture
def lf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private LLAMAFORGE_HOME for one test."""
    home = tmp_path / "home"
    monkeypatch.setenv("LLAMAFORGE_HOME", str(home))
    yield home


@pytest.fixture(scope="session")
def docker_engine() -> object:
    """A connected Docker client (skips, or fails in strict mode, without an engine)."""
    from llamaforge.core.errors import DockerUnavailable
    from llamaforge.runners.engine import docker_client

    try:
        return docker_client()
    except DockerUnavailable as error:
        require(False, f"Docker engine not reachable: {error.message}")
        raise


@pytest.fixture(scope="session")
def base_image(docker_engine: object) -> str:
    """The locally bootstrapped base image (made by `invoke images.bootstrap` in .ci/run)."""
    import docker.errors

    from llamaforge.build.images import DEFAULT_TAG

    try:
        docker_engine.images.get(DEFAULT_TAG)  # type: ignore[attr-defined]
    except docker.errors.ImageNotFound:
        require(False, f"{DEFAULT_TAG} missing: run `invoke images.bootstrap`")
    return DEFAULT_TAG


@pytest.fixture(scope="session")
def sdist_dir() -> Path:
    """Directory holding llama_cpp_python-0.3.36.tar.gz (LLAMAFORGE_TEST_SDIST_DIR), used as source mirror."""
    raw = os.environ.get("LLAMAFORGE_TEST_SDIST_DIR", "")
    path = Path(raw) if raw else None
    require(
        path is not None and (path / "llama_cpp_python-0.3.36.tar.gz").is_file(),
        "set LLAMAFORGE_TEST_SDIST_DIR to a directory with llama_cpp_python-0.3.36.tar.gz "
        "(`nox -s tests` downloads it into .ci-cache/sdist)",
    )
    assert path is not None
    return path


def prebuilt(name: str) -> Path | None:
    """``$LLAMAFORGE_TEST_PREBUILT/name`` (``stock`` or ``patched``), a build directory made elsewhere, when that
    variable is set: the llama.cpp tests then run on a machine without Docker (a CPU the build machine lacks, e.g.
    a Xeon with AMX) against builds carried there. Without it, None: the builds are made here."""
    root = os.environ.get("LLAMAFORGE_TEST_PREBUILT", "")
    if not root:
        return None
    build = Path(root) / name
    if not (build / "bin").is_dir() or not (build / "manifest.json").is_file():
        pytest.fail(f"LLAMAFORGE_TEST_PREBUILT: {build} is no build directory (bin/ and manifest.json)")
    return build


def _shared_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's LLAMAFORGE_HOME: one for all xdist workers of a run (beside their own temporary
    directories), so a build is made once and a worker that needs it while another makes it waits on the build's
    lock; without xdist, a temporary directory of its own."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return tmp_path_factory.mktemp("lf-home")
    home = tmp_path_factory.getbasetemp().parent / "lf-home"
    home.mkdir(exist_ok=True)
    return home


@pytest.fixture(scope="session")
def build_env(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> dict[str, str]:
    """Environment for `invoke build` in integration tests: one LLAMAFORGE_HOME per session (or
    LLAMAFORGE_TEST_HOME to keep builds across sessions), the sdist directory as source mirror. With prebuilt
    builds (:func:`prebuilt`) nothing is built, so neither the sdist nor the base image is needed."""
    home = Path(os.environ.get("LLAMAFORGE_TEST_HOME") or _shared_home(tmp_path_factory))
    env = {**os.environ, "LLAMAFORGE_HOME": str(home)}
    if prebuilt("patched") is None:
        request.getfixturevalue("base_image")
        env["LLAMAFORGE_SOURCE_MIRROR"] = str(request.getfixturevalue("sdist_dir"))
    return env


@pytest.fixture(scope="session")
def source_tree(build_env: dict[str, str]) -> Path:
    """The cached, unpatched llama.cpp b11312 tree (read-only: never modify it); with prebuilt builds, the tree
    (or the part of it the tests read: models/ggml-vocab-*.gguf) named by LLAMAFORGE_TEST_SOURCE."""
    if prebuilt("patched") is not None:
        tree = Path(os.environ.get("LLAMAFORGE_TEST_SOURCE", ""))
        require(tree.name != "" and (tree / "models").is_dir(), "prebuilt builds need LLAMAFORGE_TEST_SOURCE")
        return tree

    from unittest import mock

    from llamaforge.build.recipes import load_recipe
    from llamaforge.build.source import fetch_source

    with mock.patch.dict(os.environ, build_env):
        return fetch_source(load_recipe("default").source)


@pytest.fixture(scope="session")
def stock_build(build_env: dict[str, str], patched_build: Path) -> Path:
    """Directory of a stock (unpatched) CPU build of b11312: `invoke build --backend cpu --no-patches`. Made
    after the default build, whichever a test asks for first: the stock build then compiles only what the
    patches change (ccache), and two lanes of the suite never compile the whole tree twice at once."""
    from helpers import invoke_json

    return prebuilt("stock") or Path(
        invoke_json("build", "--backend", "cpu", "--no-patches", env=build_env)["build"]["path"]
    )


@pytest.fixture(scope="session")
def patched_build(build_env: dict[str, str]) -> Path:
    """Directory of the default CPU build of b11312 with patches/llama.cpp/series applied."""
    from helpers import invoke_json

    return prebuilt("patched") or Path(
        invoke_json("build", "--backend", "cpu", env=build_env)["build"]["path"]
    )


@pytest.fixture(scope="session")
def baseline_build(build_env: dict[str, str]) -> Path:
    """The default build at one CPU level, the x86-64 baseline (`invoke build --backend cpu --cpu baseline`):
    cheap next to the variants build once ccache is warm (only ggml-cpu compiles anew), it warms ccache for the
    suite's ccache-off reproducibility check and shows smoke's warning for a build that leaves CPU features unused."""
    from helpers import invoke_json

    return Path(invoke_json("build", "--backend", "cpu", "--cpu", "baseline", env=build_env)["build"]["path"])


TEST_HOST_COUNT = 3


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight qwen3 GGUF with llama.cpp's real qwen2 vocabulary (LLAMAFORGE_TEST_VOCAB), written once
    per session for the tests that serve a model (deploy, runtime image)."""
    from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model

    vocab = os.environ.get("LLAMAFORGE_TEST_VOCAB", "")
    if not Path(vocab).is_file():
        pytest.skip("set LLAMAFORGE_TEST_VOCAB to llama.cpp's models/ggml-vocab-qwen2.gguf")
    path = tmp_path_factory.mktemp("tiny-qwen3") / "tiny-qwen3.gguf"
    return write_tiny_model(path, TinyModelSpec(arch="qwen3"), Path(vocab)).path


@pytest.fixture(scope="session")
def ssh_client_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's ed25519 key pair (private key path; ``.pub`` beside it), authorized on every test host."""
    from testhosts import make_client_key

    return make_client_key(tmp_path_factory.mktemp("ssh-key"))


@pytest.fixture(scope="session")
def test_hosts(docker_engine: object, base_image: str, ssh_client_key: Path) -> Iterator[list[TestHost]]:
    """Three booted systemd + sshd hosts, shared by the session, reachable only on 127.0.0.1 (see
    tests/testhosts.py); skips, or fails in strict mode, when they cannot start."""
    import docker.errors

    from llamaforge.core.errors import LlamaforgeError
    from testhosts import ensure_image, remove_hosts, start_hosts

    try:
        hosts = start_hosts(docker_engine, ensure_image(base_image), ssh_client_key, TEST_HOST_COUNT)
    except (LlamaforgeError, RuntimeError, docker.errors.DockerException) as error:
        require(False, f"test hosts could not start: {error}")
        raise
    yield list(hosts)
    remove_hosts(hosts)


EXTRA_ENGINE_COUNT = 2


@pytest.fixture(scope="session")
def extra_engines(docker_engine: object, base_image: str) -> Iterator[list[ExtraEngine]]:
    """Two more Docker engines (tcp + TLS on 127.0.0.1, see tests/engines.py), shared by the session; skips, or
    fails in strict mode, without dockerd, openssl or ip."""
    import shutil

    from engines import engines

    require(
        all(shutil.which(tool) for tool in ("dockerd", "openssl", "ip")),
        "extra engines need dockerd, openssl, ip",
    )
    yield from engines(EXTRA_ENGINE_COUNT)
