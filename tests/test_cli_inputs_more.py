"""More inputs the command line refuses naming the option, the file or the field, each through ``invoke``: paths
no file system holds, manifests that are not a build's, a build directory that does not exist, a KV cache type
llama.cpp does not know, and what a macOS plan records for its one CPU backend. A TOML file saved with a byte-order
mark (as Windows editors save UTF-8) reads like the same file without it. None builds anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import REPO, invoke

pytestmark = pytest.mark.quick


def _error(*args: str) -> dict[str, str]:
    result = invoke(*args, "--json")
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    error: dict[str, str] = json.loads(result.stdout)["error"]
    return error


@pytest.mark.usefixtures("lf_home")
def test_a_path_longer_than_the_file_system_holds_is_refused_naming_the_option() -> None:
    # Every reader behind the option stopped on "OSError: [Errno 36] File name too long", as a traceback.
    for args, flag, length in (
        (("recipes.show", "--name", "a" * 5000), "--name", 5000),
        (("build", "--recipe", "a/" * 3000, "--dry-run"), "--recipe", 6000),
        (("models.verify", "b" * 300), "--target", 300),
        (("build", "--from-manifest", "m" * 300, "--dry-run"), "--from-manifest", 300),
    ):
        error = _error(*args)
        assert error["message"] == (
            f"{flag}: at {length} characters this path is longer than the file system allows for a path or for "
            "one name in it: give the path of an existing file, or a shipped name"
        ), error


@pytest.mark.usefixtures("lf_home")
def test_a_manifest_that_is_not_a_builds_says_what_it_lacks(tmp_path: Path) -> None:
    # It said "is not a build manifest (KeyError: 'recipe')".
    path = tmp_path / "manifest.json"
    for text, says in (
        ('{"key": "0123abcd"}', "it has no 'recipe' table, which every build records in its manifest"),
        ("[1, 2]", "it holds [1, 2], not an object"),
        ('{"recipe": {}, "options": 3}', "its 'options' is 3, not a table"),
    ):
        path.write_text(text, encoding="utf-8")
        error = _error("build", "--from-manifest", str(path), "--dry-run")
        assert error["message"] == f"--from-manifest {path} is not a build manifest: {says}", error
        assert "builds.show KEY" in error["hint"]
    path.write_text("{not json", encoding="utf-8")
    error = _error("build", "--from-manifest", str(path), "--dry-run")
    assert error["message"].startswith(f"--from-manifest {path} is not JSON: Expecting property name"), error
    # a file that cannot be read (as root, permissions do not stop a read: /proc/self/mem does)
    error = _error("build", "--from-manifest", "/proc/self/mem", "--dry-run")
    assert error["message"] == "cannot read --from-manifest /proc/self/mem: Input/output error", error


def test_a_recipe_saved_with_a_byte_order_mark_plans_like_the_same_file_without(tmp_path: Path) -> None:
    # tomllib refused the mark as "Invalid statement (at line 1, column 1)", a message that names nothing.
    text = (REPO / "recipes" / "builds" / "default.toml").read_text(encoding="utf-8")
    plain, marked = tmp_path / "plain.toml", tmp_path / "marked.toml"
    plain.write_text(text, encoding="utf-8")
    marked.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    plans = []
    for path in (plain, marked):
        result = invoke("build", "--recipe", str(path), "--cpu", "baseline", "--dry-run", "--json")
        assert result.returncode == 0, result.stderr
        plans.append(json.loads(result.stdout)["plan"])
    assert plans[0]["cmake_args"] == plans[1]["cmake_args"] and plans[0]["cpu"] == "baseline"
    assert plans[0]["plan_digest"] == plans[1]["plan_digest"]


def test_a_macos_plan_records_the_one_cpu_backend_it_builds() -> None:
    # ggml has no CPU variants on Darwin: the plan said cpu = variants, which the build never made.
    plan = json.loads(invoke("build", "--platform", "macos", "--dry-run", "--json").stdout)["plan"]
    assert plan["cpu"] == "baseline"
    ggml = sorted(arg for arg in plan["cmake_args"] if arg.startswith("-DGGML_"))
    assert ggml == [
        "-DGGML_BACKEND_DL=OFF",
        "-DGGML_CPU_ALL_VARIANTS=OFF",
        "-DGGML_METAL=ON",
        "-DGGML_METAL_EMBED_LIBRARY=ON",
        "-DGGML_NATIVE=OFF",
        "-DGGML_RPC=ON",
    ]  # no x86 feature options in an arm64 build
    error = _error("build", "--platform", "macos", "--cpu", "variants", "--dry-run")
    assert error["message"] == (
        "--cpu variants: macOS builds have one CPU backend, linked in (ggml builds no CPU variants there)"
    )
    assert "armv8.2-a+dotprod" in error["hint"]
    linux = json.loads(invoke("build", "--dry-run", "--json").stdout)["plan"]
    assert linux["cpu"] == "variants" and "-DGGML_CPU_ALL_VARIANTS=ON" in linux["cmake_args"]


def test_a_build_directory_that_does_not_exist_is_not_called_a_key(tmp_path: Path, lf_home: Path) -> None:
    # Both said "no build with key '/nonexistent'".
    missing = tmp_path / "no-such-build"
    error = _error("models.verify", "tiny", "--load-check", str(missing))
    assert error["message"] == f"--load-check {missing}: no such build directory", error
    assert not (lf_home / "models").exists()  # named before the tiny model was written
    error = _error("builds.show", "default")
    assert error["message"] == "'default' is not a build key: keys are lower-case hex digits", error


@pytest.mark.usefixtures("lf_home")
def test_a_kv_cache_type_llama_cpp_does_not_know_is_named_by_the_option_given() -> None:
    # models.split --cache-type q9 blamed --cache-type-k, an option split does not have.
    error = _error(
        "models.split", "--model", "tiny", "--ctx", "512", "--cache-type", "q9", "--devices", "a=4GiB"
    )
    assert error["message"].startswith(
        "--cache-type: 'q9' is not a KV cache type llama.cpp knows; known: f32"
    ), error
    error = _error("models.fit", "tiny", "--ctx", "512", "--cache-type", "q8", "--vram", "8GiB")
    assert (
        "--cache-type: 'q8' is not a KV cache type llama.cpp knows; did you mean 'q8_0'?" in error["message"]
    )
    error = _error("models.fit", "tiny", "--ctx", "512", "--cache-type-v", "Q8_0", "--vram", "8GiB")
    assert error["message"].startswith("--cache-type-v: 'Q8_0' is not a KV cache type"), error


@pytest.mark.usefixtures("lf_home")
def test_a_topology_file_is_read_with_a_byte_order_mark_and_an_overlong_name_is_refused(
    tmp_path: Path,
) -> None:
    # The file is read while the parameters are validated, before their path checks: an OSError traceback.
    error = _error("topology.plan", "--build", "0123abcd", "--model", "tiny", "--topology", "t" * 300)
    assert error["message"] == "topology file: File name too long (300 characters)", error
    marked = tmp_path / "topology.toml"
    marked.write_bytes(b'\xef\xbb\xbf[topology]\nhead = "127.0.0.1"\n')
    error = _error("topology.plan", "--build", "0123abcd", "--model", "tiny", "--topology", str(marked))
    assert "topology.workers: Field required" in error["message"], error  # read: the mark is no syntax error


@pytest.mark.usefixtures("lf_home")
def test_a_url_with_a_long_query_is_no_path_too_long() -> None:
    # A signed download link holds one "name" far over NAME_MAX; it is fetched, not looked up here.
    url = "https://127.0.0.1:9/model.gguf?X-Signature=" + "a" * 600
    error = _error("models.fit", url, "--ctx", "512", "--vram", "8GiB")
    assert error["message"] == f"models.fit needs a local GGUF or a fetched recipe, not {url!r}", error


def test_options_are_checked_before_the_tiny_model_is_written(lf_home: Path) -> None:
    # Each was named only after the tiny model had been written, its llama.cpp source fetched first (seconds to
    # minutes); a --margin that was no size did not say which value it was.
    for args, message in (
        (("models.fit", "tiny", "--ctx", "512", "--gpu", "nosuchgpu"), "unknown GPU 'nosuchgpu'"),
        (("models.fit", "tiny", "--ctx", "512", "--vram", "8XB"), "--vram: cannot read the size '8XB'"),
        (
            ("models.fit", "tiny", "--ctx", "512", "--vram", "8GiB", "--margin", "lots"),
            "--margin: cannot read the size 'lots'",
        ),
        (
            ("models.split", "--model", "tiny", "--ctx", "512", "--devices", "a=4XB"),
            "the memory of device a: cannot read the size '4XB'",
        ),
        (
            ("models.split", "--model", "tiny", "--ctx", "512", "--devices", "a=4GiB", "--margin", "lots"),
            "--margin: cannot read the size 'lots'",
        ),
        (("smoke", "--build", "0123abcd", "--model", "tiny"), "no build with key '0123abcd'"),
        (("smoke.cpu-modules", "--build", "0123abcd"), "no build with key '0123abcd'"),
        (("models.verify", "tiny", "--recipe", "nosuchrecipe"), "unknown model recipe 'nosuchrecipe'"),
        (("models.verify", "tiny", "--recipe", "tiny"), "--recipe 'tiny' is not a model recipe"),
    ):
        error = _error(*args)
        assert error["message"] == message, (args, error)
        assert not (lf_home / "models").exists(), args
