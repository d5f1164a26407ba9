"""What moved under a recipe between two llama.cpp trees: small trees written here for each finding, and the real
trees of llama-cpp-python 0.3.35 and 0.3.36 (b11312), whose differences were read with grep."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path, PurePosixPath

import pytest

from conftest import require
from llamaforge.build.upstream.cmake_scan import commands, scan_tree
from llamaforge.build.upstream.tree_check import TreeFinding, check_tree
from llamaforge.upgrade.results import Finding

pytestmark = pytest.mark.quick

ROOT = """cmake_minimum_required(VERSION 3.14)
project("llama.cpp" C CXX)
if (NOT DEFINED LLAMA_BUILD_NUMBER)
    set(LLAMA_BUILD_NUMBER ${BUILD_NUMBER})
endif()
option(LLAMA_BUILD_SERVER "llama: build server example" ON)
add_subdirectory(ggml)
add_subdirectory(tools)
"""


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in {"CMakeLists.txt": ROOT, **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def _check(
    tmp_path: Path,
    old: dict[str, str],
    new: dict[str, str],
    cmake: dict[str, str] | None = None,
    targets: tuple[str, ...] = (),
) -> list[TreeFinding]:
    return check_tree(
        _tree(tmp_path / "old", old), _tree(tmp_path / "new", new), cmake=cmake or {}, targets=targets
    )


def _kinds(findings: list[TreeFinding]) -> list[tuple[str, str]]:
    return [(finding.kind, finding.name) for finding in findings]


# --- the CMake reader ---------------------------------------------------------------------------------------


def test_reader_reads_commands_through_comments_quotes_and_brackets() -> None:
    text = """# option(COMMENTED "no" ON)
#[[ option(BRACKET_COMMENTED "no" ON) ]]
set(A "quoted ) paren \\" quote" CACHE STRING "doc (with parens)")
option(MULTI
       "a doc"   # a comment inside the arguments (with a paren
       ON)
if ((A AND B) OR C)
  add_executable(tool [[bracket arg]] main.cpp)
endif ()
"""
    listed = [(command.name, command.args, command.line) for command in commands(text)]
    assert listed == [
        ("set", ["A", 'quoted ) paren " quote', "CACHE", "STRING", "doc (with parens)"], 3),
        ("option", ["MULTI", "a doc", "ON"], 4),
        ("if", ["(", "A", "AND", "B", ")", "OR", "C"], 7),
        ("add_executable", ["tool", "bracket arg", "main.cpp"], 8),
        ("endif", [], 9),
    ]


def test_scan_follows_target_variables_defaults_and_output_names(tmp_path: Path) -> None:
    tree = _tree(
        tmp_path,
        {
            "ggml/CMakeLists.txt": """if (CMAKE_CROSSCOMPILING)
    set(GGML_NATIVE_DEFAULT OFF)
else()
    set(GGML_NATIVE_DEFAULT ON)
endif()
option(GGML_NATIVE "ggml: optimize for this CPU" ${GGML_NATIVE_DEFAULT})
cmake_dependent_option(GGML_DEP "dependent" ON "GGML_NATIVE" OFF)
set(GGML_OPENMP_ENABLED "ON" CACHE INTERNAL "")
add_library(ggml ggml.c)
add_library(ggml::ggml ALIAS ggml)
""",
            "tools/app/CMakeLists.txt": """set(TARGET llama-app)
add_executable(${TARGET} app.cpp)
set_target_properties(${TARGET} PROPERTIES OUTPUT_NAME llama)
""",
        },
    )
    scan = scan_tree(tree)
    assert scan.defaults("GGML_NATIVE") == ["${GGML_NATIVE_DEFAULT} (OFF|ON)"]
    assert scan.options["GGML_NATIVE"][0].where == "ggml/CMakeLists.txt:6"
    assert scan.defaults("GGML_DEP") == ["ON"]
    assert "GGML_OPENMP_ENABLED" not in scan.options  # INTERNAL: no option a person sets
    assert sorted(scan.targets) == ["ggml", "llama-app"]
    app = scan.targets["llama-app"]
    assert (app.kind, app.directory, app.output_name, app.where) == (
        "executable",
        "tools/app",
        "llama",
        "tools/app/CMakeLists.txt:2",
    )
    assert "LLAMA_BUILD_NUMBER" in scan.words


# --- options ------------------------------------------------------------------------------------------------


def test_option_gone_suggests_the_closest_declared_name(tmp_path: Path) -> None:
    findings = _check(
        tmp_path,
        {"ggml/CMakeLists.txt": 'option(GGML_CUDA_FORCE_DMMV "dmmv" OFF)\n'},
        {"ggml/CMakeLists.txt": 'option(GGML_CUDA_FORCE_MMQ "mmq" OFF)\n'},
        cmake={"GGML_CUDA_FORCE_DMMV": "ON", "LLAMA_BUILD_SERVER": "ON"},
    )
    assert _kinds(findings) == [
        ("option-gone", "GGML_CUDA_FORCE_DMMV"),
        ("option-new", "GGML_CUDA_FORCE_MMQ"),
    ]
    gone = findings[0]
    assert gone.severity == "warning"
    assert gone.old == "GGML_CUDA_FORCE_DMMV=ON (declared at ggml/CMakeLists.txt:1)"
    assert gone.new == "not declared"
    assert "or set GGML_CUDA_FORCE_MMQ (declared now)" in gone.suggestion


def test_cmake_own_and_read_variables_are_never_gone(tmp_path: Path) -> None:
    cmake = {
        "CMAKE_BUILD_TYPE": "Release",
        "CMAKE_INSTALL_RPATH": "$ORIGIN",
        "BUILD_SHARED_LIBS": "ON",
        "LLAMA_BUILD_NUMBER": "11312",  # read by `if (NOT DEFINED LLAMA_BUILD_NUMBER)`, declared nowhere
        "LLAMA_BUILD_SERVER": "ON",
    }
    assert _check(tmp_path, {}, {}, cmake=cmake) == []


def test_deprecations_map_warn_or_refuse(tmp_path: Path) -> None:
    new = {
        "ggml/CMakeLists.txt": 'option(GGML_CUDA "cuda" OFF)\nset(GGML_CUDA_FA_QUANTS "f16-f16" CACHE STRING "fa")\n',
        "cmake/depr.cmake": """function (llama_option_depr TYPE OLD)
endfunction()
llama_option_depr(FATAL_ERROR LLAMA_CUBLAS GGML_CUDA)
llama_option_depr(WARNING     LLAMA_CURL)
if (GGML_CUDA_FA_ALL_QUANTS)
    message(WARNING "GGML_CUDA_FA_ALL_QUANTS is deprecated, use GGML_CUDA_FA_QUANTS=all instead")
endif()
""",
    }
    old = {
        "ggml/CMakeLists.txt": 'option(GGML_CUDA "cuda" OFF)\noption(GGML_CUDA_FA_ALL_QUANTS "all" OFF)\n'
        'option(LLAMA_CUBLAS "old" OFF)\noption(LLAMA_CURL "curl" ON)\n'
    }
    cmake = {"LLAMA_CUBLAS": "ON", "LLAMA_CURL": "OFF", "GGML_CUDA_FA_ALL_QUANTS": "ON"}
    findings = {finding.name: finding for finding in _check(tmp_path, old, new, cmake=cmake)}
    cublas = findings["LLAMA_CUBLAS"]
    assert (cublas.kind, cublas.severity, cublas.new) == (
        "option-deprecated",
        "error",
        "deprecated (FATAL_ERROR) → GGML_CUDA=ON",
    )
    assert (
        "refuses LLAMA_CUBLAS (configure fails, cmake/depr.cmake:3): remove it (GGML_CUDA=ON is the backend's"
        in (cublas.suggestion)
    )
    curl = findings["LLAMA_CURL"]
    assert (curl.kind, curl.severity) == ("option-deprecated", "warning")
    assert curl.suggestion.endswith("it is ignored, remove it")
    quants = findings["GGML_CUDA_FA_ALL_QUANTS"]
    assert quants.new == "deprecated (WARNING) → GGML_CUDA_FA_QUANTS=all"


def test_a_deprecation_both_trees_share_is_not_news(tmp_path: Path) -> None:
    depr = {"depr.cmake": "llama_option_depr(WARNING LLAMA_NATIVE GGML_NATIVE)\n"}
    assert _check(tmp_path, depr, depr, cmake={"LLAMA_NATIVE": "ON"}) == []


def test_default_changed_matters_only_when_the_build_takes_it(tmp_path: Path) -> None:
    old = {
        "tools/CMakeLists.txt": 'option(LLAMA_BUILD_UI "ui" ON)\noption(LLAMA_OPENSSL "ssl" OFF)\n'
        'set(BORINGSSL_VERSION "1.0" CACHE STRING "version")\n'
    }
    new = {
        "tools/CMakeLists.txt": 'option(LLAMA_BUILD_UI "ui" OFF)\noption(LLAMA_OPENSSL "ssl" ON)\n'
        'set(BORINGSSL_VERSION "2.0" CACHE STRING "version")\n'
    }
    findings = _check(tmp_path, old, new, cmake={"LLAMA_OPENSSL": "OFF"})
    assert [(f.kind, f.name, f.old, f.new, f.severity) for f in findings] == [
        ("default-changed", "LLAMA_BUILD_UI", "ON", "OFF", "warning"),
        ("default-changed", "BORINGSSL_VERSION", "1.0", "2.0", "info"),  # a version, not a switch
        ("default-changed", "LLAMA_OPENSSL", "OFF", "ON", "info"),
    ]
    assert "set LLAMA_BUILD_UI=ON in [cmake] to keep the old behaviour" in findings[0].suggestion
    assert findings[2].suggestion == "the build sets LLAMA_OPENSSL=OFF, so the new default does not apply"


def test_a_forced_value_is_an_override_not_a_default(tmp_path: Path) -> None:
    old = {"tools/CMakeLists.txt": 'set(MTMD_VIDEO ON CACHE BOOL "video")\n'}
    new = {
        "tools/CMakeLists.txt": 'set(MTMD_VIDEO ON CACHE BOOL "video")\nif (WIN32)\n'
        '  set(MTMD_VIDEO OFF CACHE BOOL "video" FORCE)\nendif()\n'
    }
    assert _check(tmp_path, old, new) == []
    forced = _check(tmp_path, old, new, cmake={"MTMD_VIDEO": "ON"})
    assert _kinds(forced) == [("option-forced", "MTMD_VIDEO")]
    assert "tools/CMakeLists.txt:3" in forced[0].suggestion


# --- targets ------------------------------------------------------------------------------------------------


def test_target_renamed_in_its_directory(tmp_path: Path) -> None:
    old = {
        "tools/rpc/CMakeLists.txt": "add_executable(rpc-server rpc-server.cpp)\n",
        "tools/cli/CMakeLists.txt": "add_executable(llama-cli cli.cpp)\n",
    }
    new = {
        "tools/rpc/CMakeLists.txt": "set(TARGET ggml-rpc-server)\nadd_executable(${TARGET} rpc-server.cpp)\n",
        "tools/cli/CMakeLists.txt": "add_executable(llama-cli cli.cpp)\n",
    }
    findings = _check(tmp_path, old, new, targets=("llama-cli", "rpc-server"))
    assert _kinds(findings) == [("target-renamed", "rpc-server")]
    renamed = findings[0]
    assert (renamed.old, renamed.new, renamed.severity) == (
        "rpc-server (tools/rpc/CMakeLists.txt:1)",
        "ggml-rpc-server (tools/rpc/CMakeLists.txt:2)",
        "error",
    )
    assert "build ggml-rpc-server instead" in renamed.suggestion


def test_target_gone_and_output_renamed(tmp_path: Path) -> None:
    old = {
        "tools/CMakeLists.txt": "add_executable(llama-gguf-split split.cpp)\nadd_executable(llama-app app.cpp)\n"
    }
    new = {
        "tools/CMakeLists.txt": "add_executable(llama-app app.cpp)\n"
        "set_target_properties(llama-app PROPERTIES OUTPUT_NAME llama)\n"
    }
    findings = _check(tmp_path, old, new, targets=("llama-gguf-split", "llama-app"))
    assert _kinds(findings) == [("target-gone", "llama-gguf-split"), ("target-output-renamed", "llama-app")]
    assert findings[0].new is None
    assert "remove it from the recipe's targets" in findings[0].suggestion
    assert (findings[1].old, findings[1].new) == ("llama-app", "llama")


def test_findings_fit_the_upgrade_report() -> None:
    finding = TreeFinding("option-gone", "X", "X=ON", "not declared", "remove X", "warning")
    assert Finding.model_validate(finding.to_json()).name == "X"


# --- the real trees -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The CMake files of the llama.cpp trees that llama-cpp-python 0.3.35 and 0.3.36 vendor: the extracted trees
    beside the sdists when they are there, else only the CMake files read out of the sdists."""
    raw = os.environ.get("LLAMAFORGE_TEST_SDIST_DIR", "")
    sdists = Path(raw) if raw else None
    trees = {}
    for version in ("0.3.35", "0.3.36"):
        top = f"llama_cpp_python-{version}"
        require(
            sdists is not None and ((sdists / top).is_dir() or (sdists / f"{top}.tar.gz").is_file()),
            f"LLAMAFORGE_TEST_SDIST_DIR holds no {top}.tar.gz (`nox -s tests` downloads it into .ci-cache/sdist)",
        )
        assert sdists is not None
        extracted = sdists / top / "vendor" / "llama.cpp"
        if (extracted / "CMakeLists.txt").is_file():
            trees[version] = extracted
            continue
        target = tmp_path_factory.mktemp(top)
        prefix = PurePosixPath(top, "vendor", "llama.cpp")
        with tarfile.open(sdists / f"{top}.tar.gz") as tar:
            for member in tar:
                name = PurePosixPath(member.name)
                if (
                    member.isfile()
                    and prefix in name.parents
                    and (name.name == "CMakeLists.txt" or name.suffix == ".cmake")
                ):
                    member.name = str(name.relative_to(prefix))
                    tar.extract(member, target, filter="data")
        trees[version] = target
    return trees


DEFAULT_CMAKE = {  # the default recipe's plan (plan_build(load_recipe("default")).cmake_args)
    "BUILD_SHARED_LIBS": "ON",
    "CMAKE_BUILD_TYPE": "Release",
    "CMAKE_BUILD_WITH_INSTALL_RPATH": "ON",
    "CMAKE_INSTALL_RPATH": "$ORIGIN",
    "GGML_BACKEND_DL": "ON",
    "GGML_CPU_ALL_VARIANTS": "ON",
    "GGML_NATIVE": "OFF",
    "GGML_RPC": "ON",
    "LLAMA_BUILD_COMMIT": "0c1e570",
    "LLAMA_BUILD_EXAMPLES": "OFF",
    "LLAMA_BUILD_NUMBER": "11312",
    "LLAMA_BUILD_SERVER": "ON",
    "LLAMA_BUILD_TESTS": "OFF",
    "LLAMA_OPENSSL": "OFF",
}
DEFAULT_TARGETS = ("llama-server", "llama-bench", "llama-cli", "ggml-rpc-server")


def test_real_0335_to_0336(real_trees: dict[str, Path]) -> None:
    findings = check_tree(
        real_trees["0.3.35"], real_trees["0.3.36"], cmake=DEFAULT_CMAKE, targets=DEFAULT_TARGETS
    )
    by_name = {finding.name: finding for finding in findings}
    # CMakeLists.txt:137: option(LLAMA_BUILD_UI … ON) in 0.3.35, … OFF) in 0.3.36; the recipe does not set it
    ui = by_name["LLAMA_BUILD_UI"]
    assert (ui.kind, ui.old, ui.new, ui.severity) == ("default-changed", "ON", "OFF", "warning")
    # ggml/CMakeLists.txt:207 of 0.3.36 adds set(GGML_CUDA_FA_QUANTS "q4_0-q4_0;q8_0-q8_0;f16-f16;bf16-bf16" CACHE …)
    quants = by_name["GGML_CUDA_FA_QUANTS"]
    assert (quants.kind, quants.new) == ("option-new", "q4_0-q4_0;q8_0-q8_0;f16-f16;bf16-bf16")
    # Every -D the recipe sets is still declared or read, and all four targets are there in both (tools/rpc
    # defines ggml-rpc-server in both): nothing is gone, deprecated or renamed.
    assert not [
        f for f in findings if f.severity == "error" or f.kind.startswith(("option-gone", "option-dep"))
    ]
    assert not [f for f in findings if f.kind.startswith("target")]


def test_real_0335_to_0336_options_a_build_might_set(real_trees: dict[str, Path]) -> None:
    cmake = {**DEFAULT_CMAKE, "GGML_CUDA_PEER_MAX_BATCH_SIZE": "64", "GGML_CUDA_FA_ALL_QUANTS": "ON"}
    findings = check_tree(real_trees["0.3.35"], real_trees["0.3.36"], cmake=cmake, targets=("rpc-server",))
    by_name = {finding.name: finding for finding in findings}
    # ggml/CMakeLists.txt:203 of 0.3.35 declares GGML_CUDA_PEER_MAX_BATCH_SIZE; 0.3.36 no longer does
    assert by_name["GGML_CUDA_PEER_MAX_BATCH_SIZE"].kind == "option-gone"
    # ggml/cmake/common.cmake:60 of 0.3.36: "GGML_CUDA_FA_ALL_QUANTS is deprecated, use GGML_CUDA_FA_QUANTS=all"
    assert by_name["GGML_CUDA_FA_ALL_QUANTS"].new == "deprecated (WARNING) → GGML_CUDA_FA_QUANTS=all"
    gone = by_name["rpc-server"]  # the RPC server's target has been ggml-rpc-server since before 0.3.35
    assert gone.kind == "target-gone"
    assert "ggml-rpc-server" in gone.suggestion
