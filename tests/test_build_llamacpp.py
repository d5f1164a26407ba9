"""The real thing: llama.cpp b11312 built in Docker from the pinned sdist with a test patch applied,
through the user's entry point (`invoke build`), then run; and the second build is a cache hit.

One build per test session (ccache volume shared across runs); every test below reuses it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from helpers import COMMIT, invoke, invoke_json
from llamaforge.smoke.cpu_features import VARIANT_FEATURES

pytestmark = [pytest.mark.docker, pytest.mark.llamacpp]

BANNER = "patched: llamaforge integration test"


@pytest.fixture(scope="session")
def test_series(tmp_path_factory: pytest.TempPathFactory, source_tree: Path) -> Path:
    """A real patch against b11312: prints one more line in every tool's --version banner."""
    work = tmp_path_factory.mktemp("patch")
    relative = "common/build-info.cpp.in"
    original = (source_tree / relative).read_text(encoding="utf-8")
    anchor = '    fprintf(stream, "built with %s for %s\\n", llama_compiler(), llama_build_target());\n'
    assert anchor in original
    (work / "a" / "common").mkdir(parents=True)
    (work / "b" / "common").mkdir(parents=True)
    (work / "a" / relative).write_text(original, encoding="utf-8")
    (work / "b" / relative).write_text(
        original.replace(anchor, anchor + f'    fprintf(stream, "{BANNER}\\n");\n'), encoding="utf-8"
    )
    diff = subprocess.run(
        ["git", "diff", "--no-index", "--no-prefix", f"a/{relative}", f"b/{relative}"],
        cwd=work,
        capture_output=True,
        text=True,
    ).stdout
    series = tmp_path_factory.mktemp("series")
    (series / "0001-version-banner.patch").write_text(diff, encoding="utf-8")
    (series / "series").write_text("0001-version-banner.patch\n", encoding="utf-8")
    return series


@pytest.fixture(scope="session")
def shared_build(build_env: dict[str, str], test_series: Path) -> dict[str, Any]:
    """`invoke build --backend cpu --patches SERIES`: the one real llama.cpp build of the session."""
    result = invoke_json("build", "--backend", "cpu", "--patches", str(test_series), env=build_env)
    build: dict[str, Any] = result["build"]
    manifest_path = Path(build["path"]) / "manifest.json"
    build["manifest"] = json.loads(manifest_path.read_text(encoding="utf-8"))
    return build


def test_manifest_records_provenance(shared_build: dict[str, Any], test_series: Path) -> None:
    manifest = shared_build["manifest"]
    assert manifest["key"] == shared_build["key"]
    assert manifest["source"]["commit"] == COMMIT
    assert manifest["source"]["sha256"] == "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
    import hashlib

    patch = test_series / "0001-version-banner.patch"
    assert manifest["patches"] == [
        {"name": patch.name, "sha256": hashlib.sha256(patch.read_bytes()).hexdigest()}
    ]
    assert "-DLLAMA_BUILD_COMMIT=0c1e570" in manifest["cmake_args"]
    assert manifest["image"]["builder_id"].startswith("sha256:")
    assert manifest["image"]["base_id"].startswith("sha256:")
    assert "gcc" in manifest["toolchain"]["cc"].lower() or "cc" in manifest["toolchain"]["cc"]
    assert "cmake=" in manifest["toolchain"]["packages"]
    for relative, info in manifest["artifacts"].items():
        path = Path(shared_build["path"]) / relative
        assert path.stat().st_size == info["size"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == info["sha256"]
    assert manifest["cpu"] == "variants"
    names = {PurePosixPath(relative).name for relative in manifest["artifacts"]}
    assert {"llama-server", "llama-bench", "llama-cli", "ggml-rpc-server"} <= names
    # Each library once, under its SONAME; every CPU variant of x86-64 as a loadable module.
    assert {"libllama.so.0", "libggml.so.0", "libggml-base.so.0", "libggml-rpc.so"} <= names
    assert {
        f"libggml-cpu-{variant}.so" for variant in VARIANT_FEATURES if not variant.startswith("arm")
    } <= names
    assert not {"libllama.so", "libggml.so"} & names  # link-time names are not needed to run
    # Beside bin/, only the compiler's runtime libraries the binaries need, in lib/ (the next test).
    outside = sorted(relative for relative in manifest["artifacts"] if not relative.startswith("bin/"))
    assert outside == ["lib/libgcc_s.so.1", "lib/libgomp.so.1", "lib/libstdc++.so.6"]
    assert not any(path.is_symlink() for path in Path(shared_build["path"]).rglob("*"))
    digests = [info["sha256"] for info in manifest["artifacts"].values()]
    assert len(set(digests)) == len(digests), "the same bytes are stored twice"


def test_the_compiler_runtime_travels_in_lib_from_the_builder(shared_build: dict[str, Any]) -> None:
    """A release and a runtime image take lib/ rather than the deploying machine's copies: its files are the
    builder image's (the system the build was compiled on), load on that system's glibc, and are what the
    binaries get with lib/ on LD_LIBRARY_PATH, as the unit and the image run them."""
    from llamaforge.deploy.release import build_glibc, glibc_floor

    build, manifest = Path(shared_build["path"]), shared_build["manifest"]
    lib = build / "lib"
    names = sorted(path.name for path in lib.iterdir())
    # In the builder image: the sha256 of the file each name resolves to there, through the loader's cache.
    script = r"""for name in "$@"; do
      sha256sum "$(readlink -f "$(ldconfig -p | awk -v n="$name" '$1 == n { print $NF; exit }')")"
    done"""
    in_builder = ["docker", "run", "--rm", "--network", "none", "--entrypoint", "bash"]
    builder = manifest["image"]["builder_id"]
    listed = subprocess.run(
        [*in_builder, builder, "-c", script, "-", *names], capture_output=True, text=True, check=True
    ).stdout.split()
    assert listed[::2] == [manifest["artifacts"][f"lib/{name}"]["sha256"] for name in names], listed
    glibc = build_glibc(build)
    assert glibc is not None
    for name in names:
        floor = glibc_floor(lib / name)
        assert floor is not None and floor <= glibc, (name, floor, glibc)
    linked = subprocess.run(
        ["ldd", build / "bin" / "llama-server"],
        env={**os.environ, "LD_LIBRARY_PATH": str(lib)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in names:
        assert f"{name} => {lib / name} " in linked, linked


def test_every_binary_finds_its_libraries_beside_it(shared_build: dict[str, Any]) -> None:
    binaries = Path(shared_build["path"]) / "bin"
    for path in sorted(binaries.iterdir()):
        linked = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
        assert "not found" not in linked, (path.name, linked)
        for line in linked.splitlines():
            if "libllama" in line or "libggml" in line:
                assert str(binaries) in line, (path.name, line)  # found through RPATH $ORIGIN


def test_default_build_loads_the_best_cpu_variant_for_this_host(
    shared_build: dict[str, Any], tiny_qwen3: Path
) -> None:
    """The issue's "done when": on this machine the default build runs with AVX2/FMA/F16C through the variant
    it loads (from the build directory, no LD_LIBRARY_PATH)."""
    from llamaforge.smoke.cpu_features import HOST_FLAGS, VARIANT_FEATURES, host_cpu_flags, loaded_variant

    bench = Path(shared_build["path"]) / "bin" / "llama-bench"
    env = {key: value for key, value in os.environ.items() if key != "LD_LIBRARY_PATH"}
    result = subprocess.run(
        [bench, "-m", tiny_qwen3, "-p", "8", "-n", "4", "-r", "1", "-t", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    module, variant = loaded_variant(result.stderr)
    assert module is not None and Path(module).parent == bench.parent, result.stderr[-2000:]
    assert variant in VARIANT_FEATURES
    host = host_cpu_flags(Path("/proc/cpuinfo").read_text(encoding="utf-8"))
    wanted = {name for name in ("AVX2", "FMA", "F16C") if HOST_FLAGS[name] in host}
    assert wanted <= set(VARIANT_FEATURES[variant]), (variant, wanted)


def test_llama_cli_version_shows_injected_commit_and_patch(shared_build: dict[str, Any]) -> None:
    cli = Path(shared_build["path"]) / "bin" / "llama-cli"
    result = subprocess.run([cli, "--version"], capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    assert "build 11312, commit 0c1e570" in output
    assert BANNER in output


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory, source_tree: Path) -> Path:
    from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model

    path = tmp_path_factory.mktemp("models") / "tiny-qwen3.gguf"
    write_tiny_model(path, TinyModelSpec(arch="qwen3"), source_tree / "models" / "ggml-vocab-qwen2.gguf")
    return path


def test_llama_bench_runs_tiny_qwen3(shared_build: dict[str, Any], tiny_qwen3: Path) -> None:
    bench = Path(shared_build["path"]) / "bin" / "llama-bench"
    result = subprocess.run(
        [bench, "-m", tiny_qwen3, "-p", "16", "-n", "16", "-r", "2", "-t", "1", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(result.stdout)
    assert {row["build_commit"] for row in rows} == {"0c1e570"}
    assert all(row["build_number"] == 11312 for row in rows)
    assert all("qwen3" in row["model_type"] for row in rows)
    generation = [row for row in rows if row["n_gen"] > 0]
    assert generation and generation[0]["avg_ts"] > 1.0


def test_second_build_is_cache_hit(
    shared_build: dict[str, Any], build_env: dict[str, str], test_series: Path
) -> None:
    started = time.monotonic()
    again = invoke_json("build", "--backend", "cpu", "--patches", str(test_series), env=build_env)["build"]
    wall = time.monotonic() - started
    assert again["cached"] is True
    assert again["key"] == shared_build["key"]
    print(f"cache hit through `invoke build`: {wall:.2f} s wall")


def test_dry_run_shows_the_key_of_the_existing_build(
    shared_build: dict[str, Any], build_env: dict[str, str], test_series: Path
) -> None:
    plan = invoke_json("build", "--backend", "cpu", "--patches", str(test_series), "--dry-run", env=build_env)
    assert plan["plan"]["cache_key"] == shared_build["key"]


def test_cache_hit_starts_no_container(
    shared_build: dict[str, Any], build_env: dict[str, str], test_series: Path
) -> None:
    from llamaforge.runners.engine import docker_client

    since = int(time.time()) - 1
    again = invoke_json("build", "--backend", "cpu", "--patches", str(test_series), env=build_env)["build"]
    assert again["cached"] is True
    until = int(time.time()) + 1
    created = list(
        docker_client().events(
            since=since, until=until, decode=True, filters={"type": "container", "event": "create"}
        )
    )
    assert created == []


def test_conflicting_patch_fails_naming_patch_and_hunk(
    shared_build: dict[str, Any], build_env: dict[str, str], tmp_path: Path, test_series: Path
) -> None:
    series = tmp_path / "series"
    series.mkdir()
    text = (test_series / "0001-version-banner.patch").read_text(encoding="utf-8")
    (series / "0001-stale.patch").write_text(text.replace("built with %s for %s", "built by %s on %s"))
    (series / "series").write_text("0001-stale.patch\n")
    store = Path(build_env["LLAMAFORGE_HOME"]) / "builds"
    result = invoke("build", "--backend", "cpu", "--patches", str(series), env=build_env)
    assert result.returncode == 4, result.stderr
    assert "0001-stale.patch" in result.stderr
    assert "common/build-info.cpp.in" in result.stderr and "hunk #1" in result.stderr
    assert "Traceback" not in result.stderr
    # Nothing of it was published (the store is the suite's: the other lane may publish its own builds meanwhile).
    published = [path for path in store.glob("*/manifest.json") if "0001-stale.patch" in path.read_text()]
    assert published == []


# The ccache-off proof's target: the RPC server, which links ggml alone: ggml-base, ggml, the CPU backend at one
# level and ggml-rpc (C and C++), the binary, RPATH, SONAME copies and the compiler's runtime libraries, rebuilt
# from nothing in a fraction of the default build's steps. llama, llama-common (build-info) and the tools are
# proved by `nox -s reproducible_variants`, the whole default build rebuilt with ccache off (docs/benchmarks.md).
REPRODUCIBLE_TARGETS = ("ggml-rpc-server",)


def test_rebuild_without_ccache_is_bit_identical(
    baseline_build: Path, build_env: dict[str, str], tmp_path: Path
) -> None:
    """`invoke build --check-reproducible`: a fresh container, ccache off, every artifact's sha256 compared.

    The suite proves it on the default recipe at one CPU level for ggml-rpc-server: the same compile flags,
    backend loader, RPATH and SONAME copies as the variants build, ggml and one CPU module rebuilt from nothing.
    The first build of that recipe is all ccache hits (the baseline build compiled every object it needs).
    `nox -s reproducible_variants` proves the whole default build, every target and CPU variant."""
    default = Path(__file__).parents[1] / "recipes" / "builds" / "default.toml"
    text, count = re.subn(
        r"(?m)^targets = .*$", f"targets = {json.dumps(list(REPRODUCIBLE_TARGETS))}", default.read_text()
    )
    assert count == 1, "no targets line in recipes/builds/default.toml"
    recipe = tmp_path / "reproducible.toml"
    recipe.write_text(text, encoding="utf-8")
    args = ("build", "--recipe", str(recipe), "--cpu", "baseline")
    built = invoke_json(*args, env=build_env)["build"]
    result = invoke_json(*args, "--check-reproducible", env=build_env)
    manifest = json.loads((Path(built["path"]) / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["cpu"] == "baseline" and manifest["recipe"]["targets"] == list(REPRODUCIBLE_TARGETS)
    for name in ("ggml-rpc-server", "libggml-base.so.0", "libggml.so.0", "libggml-cpu.so", "libggml-rpc.so"):
        assert f"bin/{name}" in manifest["artifacts"], sorted(manifest["artifacts"])
    report = result["reproducibility"]
    assert report["different"] == [], report
    assert report["reproducible"] is True
    assert sorted(report["identical"]) == sorted(manifest["artifacts"])
