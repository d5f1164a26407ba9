"""More build inputs refused when read, naming the file, the field or the option: matrix entries, recipes, CPU
levels against the platform's architecture and builder fleets. Each goes through ``invoke`` where the user meets
it, none builds anything."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import REPO, invoke

pytestmark = pytest.mark.quick


def _matrix(tmp_path: Path, text: str) -> str:
    path = tmp_path / "m.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_matrix_entry_with_an_unknown_executor_names_the_field(tmp_path: Path) -> None:
    # It was a pydantic traceback from the build's parameters, after the matrix had loaded.
    path = _matrix(tmp_path, '[[builds]]\nname = "a"\nexecutor = "bogus"\n')
    result = invoke("build", "--matrix", path, "--dry-run", "--json")
    assert result.returncode == 2, result.stderr
    error = json.loads(result.stdout)["error"]
    assert f"invalid build matrix {path}" in error["message"]
    assert "builds.0.executor: Input should be 'docker', 'local' or 'ssh'" in error["message"]
    assert "Traceback" not in result.stderr


def test_a_cpu_level_of_another_architecture_than_the_platform_builds_is_refused(tmp_path: Path) -> None:
    # A Mac builds arm64 and Windows x64: the x86 level was recorded in the plan and never built on a Mac.
    for platform, level, builds in (
        ("macos", "x86-64-v3", "macOS builds are for aarch64"),
        ("windows", "armv8.2-a+dotprod", "Windows builds are for x86_64"),
    ):
        result = invoke("build", "--platform", platform, "--cpu", level, "--dry-run", "--json")
        assert result.returncode == 2, result.stderr
        error = json.loads(result.stdout)["error"]
        assert (
            error["message"]
            == f"CPU level {level!r} is for {'x86_64' if 'x86' in level else 'aarch64'}, but " + builds
        )
        assert "native, baseline" in error["hint"]
    for platform, level in (("macos", "armv8.2-a+dotprod"), ("windows", "x86-64-v4"), ("macos", "native")):
        plan = json.loads(
            invoke("build", "--platform", platform, "--cpu", level, "--dry-run", "--json").stdout
        )
        assert plan["plan"]["cpu"] == level


def _recipe(tmp_path: Path, old: str, new: str) -> str:
    """The default recipe with ``old`` replaced by ``new``, as a file."""
    text = (REPO / "recipes" / "builds" / "default.toml").read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / "edited.toml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return str(path)


def test_a_target_listed_twice_is_refused_naming_it(tmp_path: Path) -> None:
    # The plan listed bin/llama-server twice among the artifacts.
    path = _recipe(tmp_path, "targets = [", 'targets = ["llama-server", ')
    result = invoke("recipes.show", "--name", path)
    assert result.returncode == 2
    assert f"invalid recipe {path}" in result.stderr
    assert "targets: llama-server listed twice; list each target once" in result.stderr


def test_a_build_number_larger_than_llama_cpp_compiles_is_refused(tmp_path: Path) -> None:
    # It became -DLLAMA_BUILD_NUMBER=99999999999999999999, which llama.cpp compiles into an int.
    path = _recipe(tmp_path, "build_number = 11312", "build_number = 99999999999999999999")
    result = invoke("build", "--recipe", path, "--dry-run")
    assert result.returncode == 2
    assert (
        "source.build_number: 99999999999999999999 is larger than a build number can be (at most 2147483647)"
        in result.stderr
    )
    largest = _recipe(tmp_path, "build_number = 11312", "build_number = 2147483647")
    plan = json.loads(invoke("build", "--recipe", largest, "--dry-run", "--json").stdout)["plan"]
    assert "-DLLAMA_BUILD_NUMBER=2147483647" in plan["cmake_args"]


def _fleet(tmp_path: Path, builder: str, platforms: str = '["linux"]') -> str:
    path = tmp_path / "fleet.toml"
    path.write_text(f'[[builders]]\nname = "a"\nplatforms = {platforms}\n{builder}\n', encoding="utf-8")
    return str(path)


def test_fleet_engines_that_cannot_work_are_refused_when_the_fleet_loads(tmp_path: Path) -> None:
    # Port 0 and a path or query reached the docker client ("Invalid bind address format"); an engine that
    # lists macos looked like a Mac builder that placement never used.
    for engine, platforms, message in (
        ("tcp://h:0", '["linux"]', "'tcp://h:0' names no host and valid port"),
        ("ssh://u@h:22/x?y=1", '["linux"]', "names only the user, host and port, no path or query"),
        (
            "unix:///nonexistent.sock",
            '["linux", "macos"]',
            "builder 'a' lists macos: a Docker engine builds linux and windows (mingw); macOS builds need a Mac",
        ),
    ):
        path = _fleet(tmp_path, f'engine = "{engine}"', platforms)
        result = invoke("builders.status", "--builders", path, "--json")
        assert result.returncode == 2, result.stderr
        error = json.loads(result.stdout)["error"]
        assert f"invalid builder fleet {path}" in error["message"] and message in error["message"]


def test_a_cert_path_without_the_tls_files_is_named_with_the_builder(tmp_path: Path) -> None:
    # The docker client's own words were "Path to a certificate and key files must be provided through the
    # client_cert param".
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "ca.pem").write_text("x", encoding="utf-8")
    for cert_path, message in (
        ("missing", f"the cert_path of builder a, {tmp_path / 'missing'}, does not exist"),
        ("fleet.toml", f"the cert_path of builder a, {tmp_path / 'fleet.toml'}, is no directory"),
        ("certs", f"the cert_path of builder a, {certs}, has no cert.pem, key.pem"),
    ):
        path = _fleet(tmp_path, f'engine = "tcp://127.0.0.1:1"\ntls_verify = true\ncert_path = "{cert_path}"')
        status = invoke("builders.status", "--builders", path, "--json")
        (row,) = json.loads(status.stdout)["builders"]
        assert row["error"] == message and "ca.pem, cert.pem, key.pem" in row["hint"]
        matrix = _matrix(tmp_path, '[[builds]]\nname = "a"\n')
        planned = invoke("build", "--matrix", matrix, "--builders", path, "--dry-run", "--json")
        assert planned.returncode == 2 and json.loads(planned.stdout)["error"]["message"] == message


def test_a_cmake_key_that_is_no_variable_name_is_named_as_such() -> None:
    # It was "not a CMake option this build accepts", with a hint about compilers and toolchain files.
    for key in ("A B", "GGML_RPC:BOOL"):
        result = invoke("build", "--cmake", f"{key}=ON", "--dry-run", "--json")
        assert result.returncode == 2
        error = json.loads(result.stdout)["error"]
        assert error["message"] == f"--cmake {key!r}: not a CMake variable name"
        assert "letters, digits and '_'" in error["hint"] and "compiler" not in error["hint"]


def test_a_cmake_option_given_twice_with_different_values_is_refused() -> None:
    # Only the last value reached cmake.
    result = invoke(
        "build",
        "--cmake",
        "GGML_SCHED_MAX_COPIES=1",
        "--cmake",
        "GGML_SCHED_MAX_COPIES=2",
        "--dry-run",
        "--json",
    )
    assert result.returncode == 2
    assert (
        json.loads(result.stdout)["error"]["message"]
        == "--cmake GGML_SCHED_MAX_COPIES given twice with different values"
    )
    same = invoke(
        "build",
        "--cmake",
        "GGML_SCHED_MAX_COPIES=1",
        "--cmake",
        "GGML_SCHED_MAX_COPIES=1",
        "--dry-run",
        "--json",
    )
    assert "-DGGML_SCHED_MAX_COPIES=1" in json.loads(same.stdout)["plan"]["cmake_args"]


def test_a_ca_bundle_that_is_a_directory_is_named_as_one(tmp_path: Path) -> None:
    # "CA bundle DIR does not exist" sent the user looking for a path that is there.
    given = invoke("build", "--ca-bundle", str(tmp_path), "--dry-run", "--json")
    assert given.returncode == 2
    error = json.loads(given.stdout)["error"]
    assert error["message"] == f"CA bundle {tmp_path} is a directory, not a file"
    env = {key: value for key, value in os.environ.items() if key != "PIP_CERT"}
    env["SSL_CERT_FILE"] = str(tmp_path)
    host = invoke("build", "--arch", "86", "--dry-run", "--json", env=env)
    assert host.returncode == 2
    message = json.loads(host.stdout)["error"]["message"]
    assert message == f"SSL_CERT_FILE names the CA bundle {tmp_path}, which is a directory, not a file"
    checks = json.loads(invoke("doctor", "--json", env=env).stdout)["checks"]
    (bundle,) = [check for check in checks if check["name"] == "ca bundle"]
    assert bundle["detail"] == f"{tmp_path} from SSL_CERT_FILE is a directory, not a file"


def test_no_patches_with_a_series_is_refused(tmp_path: Path) -> None:
    # The plan left the named series out in silence.
    result = invoke("build", "--no-patches", "--patches", "llama.cpp", "--dry-run", "--json")
    assert result.returncode == 2
    assert json.loads(result.stdout)["error"]["message"] == (
        "--no-patches and --patches llama.cpp contradict each other"
    )
    path = _matrix(tmp_path, '[[builds]]\nname = "a"\nno_patches = true\npatches = "llama.cpp"\n')
    (row,) = json.loads(invoke("build", "--matrix", path, "--dry-run", "--json").stdout)["matrix"]
    assert row["result"] == "failed" and "contradict each other" in row["error"]


def test_empty_paths_in_a_matrix_are_refused_when_it_loads(tmp_path: Path) -> None:
    # recipe = "" or patches = "" was a pydantic traceback from the build's parameters.
    for text, field in (
        ('recipe = ""\n[[builds]]\nname = "a"\n', "recipe"),
        ('[[builds]]\nname = "a"\nrecipe = ""\n', "builds.0.recipe"),
        ('[[builds]]\nname = "a"\npatches = ""\n', "builds.0.patches"),
        (
            '[[builds]]\nname = "a"\nexecutor = "ssh"\nbuild_host = "u@h:22"\nssh_key = ""\n',
            "builds.0.ssh_key",
        ),
    ):
        path = _matrix(tmp_path, text)
        result = invoke("build", "--matrix", path, "--dry-run", "--json")
        assert result.returncode == 2, result.stderr
        message = json.loads(result.stdout)["error"]["message"]
        assert f"invalid build matrix {path}" in message
        assert f"{field}: String should have at least 1 character" in message
        assert "Traceback" not in result.stderr


def test_an_empty_patch_series_in_a_recipe_is_named(tmp_path: Path) -> None:
    # patches = "" was read as the current directory: "'.' is no patch series: it has no series file".
    path = _recipe(tmp_path, 'patches = "llama.cpp"', 'patches = ""')
    result = invoke("build", "--recipe", path, "--dry-run")
    assert result.returncode == 2
    assert "patches: an empty series names nothing" in result.stderr and "--no-patches" in result.stderr


def test_a_cuda_toolkit_for_a_build_without_cuda_is_refused() -> None:
    # --cuda-toolkit image planned a CPU build and changed nothing.
    for extra, backend in ((), "cpu"), (("--backend", "vulkan"), "vulkan"):
        result = invoke("build", "--cuda-toolkit", "image", *extra, "--dry-run", "--json")
        assert result.returncode == 2
        error = json.loads(result.stdout)["error"]
        assert (
            error["message"] == f"--cuda-toolkit image only applies to CUDA builds, not --backend {backend}"
        )
        assert "--arch" in error["hint"]
    cuda = invoke("build", "--cuda-toolkit", "image", "--arch", "86", "--dry-run", "--json")
    assert json.loads(cuda.stdout)["plan"]["backend"] == "cuda"


def test_a_remote_ccache_on_port_0_is_refused() -> None:
    # urlsplit takes port 0, and the build would have run with a cache no server answers.
    for url in ("redis://h:0", "http://h:0/cache"):
        result = invoke("build", "--ccache-remote", url, "--dry-run", "--json")
        assert result.returncode == 2
        assert json.loads(result.stdout)["error"]["message"] == (
            f"--ccache-remote {url}: the port is not a number 1-65535"
        )


def test_from_manifest_naming_a_directory_says_so(tmp_path: Path) -> None:
    # It said the directory "does not exist".
    result = invoke("build", "--from-manifest", str(tmp_path), "--dry-run", "--json")
    assert result.returncode == 2
    error = json.loads(result.stdout)["error"]
    assert error["message"] == f"manifest {tmp_path} is a directory, not a manifest file"
    assert "manifest.json" in error["hint"]


def test_a_shipped_file_named_with_its_toml_points_at_its_name() -> None:
    # "default.toml" is looked for in the current directory; the hint said only "check the path".
    for task, option, name in (
        ("recipes.show", "--name", "default"),
        ("builders.status", "--builders", "example"),
    ):
        result = invoke(task, option, f"{name}.toml")
        assert result.returncode == 2
        assert f"file {name}.toml does not exist" in result.stderr
        assert f"is named without .toml: {name}" in result.stderr


def test_a_builder_memory_of_inf_is_refused_when_the_fleet_loads(tmp_path: Path) -> None:
    # It loaded, and the status of a builder that answers could not hold it (results take finite numbers only).
    path = _fleet(tmp_path, 'engine = "unix:///nonexistent.sock"\nmemory_gib = inf')
    result = invoke("builders.status", "--builders", path, "--json")
    assert result.returncode == 2
    assert (
        "builders.0.memory_gib: Input should be a finite number"
        in json.loads(result.stdout)["error"]["message"]
    )


def test_a_fleet_selection_that_names_no_builder_is_refused() -> None:
    # "example:," reported "0 of 0 builders answered" and a matrix had no builder to run on.
    for command in (("builders.status",), ("build", "--matrix", "rtx", "--dry-run")):
        result = invoke(*command, "--builders", "example:,", "--json")
        assert result.returncode == 2
        error = json.loads(result.stdout)["error"]
        assert error["message"].startswith("the selection ',' of builder fleet ")
        assert error["message"].endswith("example.toml names no builder")


def test_doctor_fails_the_disk_check_when_the_home_is_a_file(tmp_path: Path) -> None:
    # run_doctor made the directory unguarded: a FileExistsError traceback.
    home = tmp_path / "home"
    home.write_text("", encoding="utf-8")
    result = invoke("doctor", "--json", env={**os.environ, "LLAMAFORGE_HOME": str(home)})
    assert "Traceback" not in result.stderr
    checks = json.loads(result.stdout)["checks"]
    (disk,) = [check for check in checks if check["name"] == "disk"]
    assert disk["status"] == "fail"
    assert disk["detail"] == f"{home}, where builds and models go, is a file, not a directory"
    assert "LLAMAFORGE_HOME" in disk["hint"]


def test_the_build_store_under_a_file_is_named_not_empty(tmp_path: Path) -> None:
    # builds.list said "no builds yet" when LLAMAFORGE_HOME was a file, where no build can ever be stored.
    home = tmp_path / "home"
    home.write_text("", encoding="utf-8")
    env = {**os.environ, "LLAMAFORGE_HOME": str(home)}
    for command in (("builds.list",), ("builds.show", "--key", "ab")):
        result = invoke(*command, "--json", env=env)
        assert result.returncode != 0
        error = json.loads(result.stdout)["error"]
        assert error["message"] == f"{home}, where builds are stored, is not a directory"
        assert "LLAMAFORGE_HOME" in error["hint"]


def test_an_ssh_key_that_is_no_file_is_named_before_connecting(tmp_path: Path) -> None:
    # The host's refusal would have named the key as refused, though it was never offered.
    for key, what in ((tmp_path, "is a directory, not a key file"), (tmp_path / "gone", "does not exist")):
        args = ("--executor", "ssh", "--build-host", "u@127.0.0.1:22", "--ssh-key", str(key))
        result = invoke("build", *args, "--dry-run", "--json")
        assert result.returncode == 2
        assert json.loads(result.stdout)["error"]["message"] == f"--ssh-key {key} {what}"
    path = _fleet(tmp_path, 'build_host = "u@127.0.0.1:22"\nssh_key = "gone"')
    (row,) = json.loads(invoke("builders.status", "--builders", path, "--json").stdout)["builders"]
    assert row["error"] == f"builder a: ssh_key {tmp_path / 'gone'} does not exist"


def test_known_hosts_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    # It was skipped when read (files only), so the build host's key was reported as never seen.
    args = ("--executor", "ssh", "--build-host", "u@127.0.0.1:22", "--known-hosts", str(tmp_path))
    result = invoke("build", *args, "--dry-run", "--json")
    assert result.returncode == 2
    error = json.loads(result.stdout)["error"]
    assert error["message"] == f"--known-hosts {tmp_path} is a directory, not a known_hosts file"


def test_a_fleet_builders_known_hosts_directory_is_named(tmp_path: Path) -> None:
    (tmp_path / "hosts").mkdir()
    path = _fleet(tmp_path, 'build_host = "u@127.0.0.1:22"\nknown_hosts = "hosts"')
    (row,) = json.loads(invoke("builders.status", "--builders", path, "--json").stdout)["builders"]
    assert (
        row["error"] == f"builder a: known_hosts {tmp_path / 'hosts'} is a directory, not a known_hosts file"
    )


def test_a_base_image_for_a_build_on_a_host_is_refused() -> None:
    # A Mac or an MSVC build has no builder image: --base-image was accepted and changed nothing.
    for extra, where in (
        (("--platform", "macos"), "macOS builds run"),
        (("--platform", "windows", "--toolchain", "msvc"), "Windows builds with msvc run"),
    ):
        result = invoke("build", *extra, "--base-image", "debian:trixie", "--dry-run", "--json")
        assert result.returncode == 2
        message = json.loads(result.stdout)["error"]["message"]
        assert message == f"--base-image debian:trixie: {where} on a build host, with no builder image"
    mingw = invoke("build", "--platform", "windows", "--base-image", "debian:trixie", "--dry-run", "--json")
    assert json.loads(mingw.stdout)["plan"]["base_image"]["tag"] == "debian:trixie"
