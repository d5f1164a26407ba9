"""``upgrade``: the pieces that need no build (the verdict, the recipe rewrite of --apply, the parameters, the
MCP confirmation of --apply only), then for real on the llama.cpp sdists of PyPI:

- a dry run from the pinned b11312 to llama-cpp-python 0.3.35's llama.cpp: the series rebases for real, the recipe
  is checked against the new tree, nothing under recipes/ or patches/ changes;
- a real conflict: a tree made from b11312 with the context of the remap patch moved (an archive with its sha256),
  reported hunk by hunk with its workspace; resolved there, the run goes on with --resume;
- bad input: a version with no sdist, a package that vendors no llama.cpp, a wrong sha256 — a clear error, no run
  directory, nothing changed.

The full upgrade (both builds, smokes side by side, fit, report, --apply) is the recorded ``nox -s upgrade``
session, and ``test_full_upgrade_to_b11312`` when LLAMAFORGE_TEST_FULL_UPGRADE is set: a cold candidate build is
minutes on 2 cores."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from conftest import require
from helpers import REPO, invoke
from llamaforge.core.registry import operations
from llamaforge.upgrade.report import decide
from llamaforge.upgrade.results import FitRow, ModelComparison, PatchOutcome, Rebase, StageFailure

pytestmark = pytest.mark.quick

OLD_SDIST = "llama_cpp_python-0.3.35.tar.gz"
OLD_COMMIT = "4df29be4f4c3673f428170fda944a5b19f743bb8"


# --- the verdict --------------------------------------------------------------------------------------------


def _rebase(ok: bool = True) -> Rebase:
    status = "applies" if ok else "conflicts"
    patch = PatchOutcome(
        name="0001-x.patch", status=status, files={} if ok else {"src/a.cpp": ["@@ -1 +1 @@"]}
    )
    return Rebase(series="/s", workspace="/w", patches=[patch], ok=ok)


def _smoke(pp: tuple[float, float], tg: tuple[float, float], passed: tuple[bool, bool] = (True, True)) -> Any:
    rows = [
        {"metric": "llama-bench pp64", "unit": "t/s", "a": pp[0], "b": pp[1], "ratio": pp[1] / pp[0]},
        {"metric": "llama-bench tg32", "unit": "t/s", "a": tg[0], "b": tg[1], "ratio": tg[1] / tg[0]},
    ]
    for row in rows:
        row["speedup"] = row["ratio"]
    return ModelComparison(
        model="tiny", old_run="a", new_run="b", old_passed=passed[0], new_passed=passed[1], rows=rows
    )


def _decide(**overrides: Any) -> tuple[str, list[str]]:
    arguments: dict[str, Any] = {
        "dry_run": False,
        "rebase": _rebase(),
        "findings": [],
        "failure": None,
        "smokes": [_smoke((100, 101), (50, 49))],
        "fit": [],
        "tolerance": 0.10,
        **overrides,
    }
    return decide(**arguments)


def test_verdicts_worst_first() -> None:
    assert _decide() == ("upgrade ok", [])
    verdict, reasons = _decide(rebase=_rebase(ok=False))
    assert verdict == "conflicts" and "0001-x.patch" in reasons[0]
    verdict, reasons = _decide(failure=StageFailure(stage="build-new", message="exit 1"))
    assert verdict == "broken" and reasons[0] == "build-new: exit 1"
    verdict, reasons = _decide(smokes=[_smoke((100, 80), (50, 50))])
    assert verdict == "regression" and "pp64 100.0 → 80.0 t/s (x0.80" in reasons[0]
    assert _decide(smokes=[_smoke((100, 80), (50, 50))], tolerance=0.25)[0] == "upgrade ok"
    verdict, reasons = _decide(smokes=[_smoke((100, 100), (50, 50), passed=(True, False))])
    assert verdict == "regression" and "fails on the new one" in reasons[0]
    assert _decide(dry_run=True)[0] == "dry run"


def test_a_moved_buffer_size_is_a_note_not_a_regression() -> None:
    fit = [
        FitRow(model="tiny", category="compute", planned_mib=1.0, old_mib=1.0, new_mib=2.5, moved=True),
        FitRow(model="tiny", category="weights", planned_mib=3.0, old_mib=3.0, new_mib=3.0, moved=False),
    ]
    verdict, reasons = _decide(fit=fit)
    assert verdict == "upgrade ok"
    assert reasons == ["llama.cpp now sizes tiny compute 1.0 → 2.5 MiB: re-check the fit of your models"]


# --- --apply's rewrite of the recipe --------------------------------------------------------------------------


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the shipped recipes and patches, which the tests may change."""
    for kind in ("recipes", "patches"):
        shutil.copytree(REPO / kind, tmp_path / kind)
        monkeypatch.setenv(f"LLAMAFORGE_{kind.upper()}_DIR", str(tmp_path / kind))
    return tmp_path


NEW_SOURCE = {
    "kind": "pypi-sdist",
    "package": "llama-cpp-python",
    "version": "0.3.35",
    "sha256": "1139dbb54509074b70893fab8554e3b079aa9f4d312058ce4018ef0019e3de12",
    "subdir": "llama_cpp_python-0.3.35/vendor/llama.cpp",
    "commit": OLD_COMMIT,
    "build_number": 11111,  # a made-up number for the rewrite only: no build or test reads it as a fact
    "date": "2026-08-16",
}


def test_apply_rewrites_the_source_table_and_the_release_it_names(project: Path, tmp_path: Path) -> None:
    from llamaforge.build.recipes import load_recipe
    from llamaforge.upgrade.apply import apply_upgrade

    recipe_file = project / "recipes" / "builds" / "default.toml"
    before = recipe_file.read_text(encoding="utf-8")
    series = project / "patches" / "llama.cpp"
    candidate = tmp_path / "candidate"
    shutil.copytree(series, candidate)
    first = sorted(candidate.glob("0001-*.patch"))[0]
    first.write_text(first.read_text(encoding="utf-8") + "\n", encoding="utf-8")  # "refreshed"

    written = apply_upgrade(load_recipe("default"), "default", dict(NEW_SOURCE), candidate)

    assert written == [str(recipe_file), str(series / first.name)]
    after = recipe_file.read_text(encoding="utf-8")
    recipe = load_recipe("default")
    assert recipe.source.commit == OLD_COMMIT and recipe.source.build_number == 11111
    assert "b11312" not in after and "0.3.36" not in after
    assert recipe.description.startswith("llama.cpp b11111 ")
    # Only the release names and the [source] table changed: every other line (comments, cmake, images) stays.
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=False) if a != b]
    assert all("b11312" in a or "0.3.36" in a or a.split("=")[0].strip() in NEW_SOURCE for a, _ in changed)
    assert before.count("\n") == after.count("\n") + 1 - 1  # same length: build_number/date kept their lines


def test_apply_refuses_a_source_the_recipe_could_not_load(project: Path, tmp_path: Path) -> None:
    from llamaforge.build.recipes import load_recipe
    from llamaforge.core.errors import InvalidOption
    from llamaforge.upgrade.apply import apply_upgrade

    recipe_file = project / "recipes" / "builds" / "default.toml"
    before = recipe_file.read_text(encoding="utf-8")
    with pytest.raises(InvalidOption, match="would not load") as caught:
        apply_upgrade(load_recipe("default"), "default", {**NEW_SOURCE, "commit": "abc"}, tmp_path)
    assert caught.value.hint == "nothing was written"
    assert recipe_file.read_text(encoding="utf-8") == before


# --- parameters and fronts --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--dry-run", "--apply", "--to", "llama-cpp-python==0.3.35"], "pick one"),
        ([], "name the release with --to SOURCE"),
        (["--to", "x==1", "--resume", "somewhere"], "drop --to"),
        (["--dry-run", "--resume", "/nonexistent/run"], "no upgrade run '/nonexistent/run'"),  # not a glob
        (["--dry-run", "--resume", "*"], "no upgrade run '*'"),
    ],
)
def test_bad_parameters_are_named(arguments: list[str], message: str, lf_home: Path) -> None:
    result = invoke("upgrade", *arguments)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_only_apply_makes_an_upgrade_destructive() -> None:
    op = operations()["upgrade"]
    assert op.long_running and not op.destructive and op.destructive_when == "apply"
    assert op.destroys({"to": "llama-cpp-python==0.3.35", "apply": True})
    assert not op.destroys({"to": "llama-cpp-python==0.3.35"})
    assert not op.destroys({"to": "llama-cpp-python==0.3.35", "dry_run": True, "apply": False})


@pytest.mark.anyio
async def test_mcp_asks_a_person_before_an_apply_and_not_before_a_dry_run(lf_home: Path) -> None:
    from mcp import Client

    from llamaforge.fronts.mcp.server import build_server

    async with Client(build_server()) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert "Destructive with apply=true" in (tools["upgrade"].description or "")
        applied = await client.call_tool("upgrade", {"resume": "no-such-run", "apply": True})
        assert applied.is_error
        text = "\n".join(getattr(block, "text", "") for block in applied.content)
        assert "needs a person's confirmation" in text
        dry = await client.call_tool("upgrade", {"resume": "no-such-run", "dry_run": True})
        text = "\n".join(getattr(block, "text", "") for block in dry.content)
        assert dry.is_error and "no upgrade run 'no-such-run'" in text  # it ran: no confirmation asked


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# --- for real, on PyPI's sdists ---------------------------------------------------------------------------


def _digest(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(directory)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture
def upgrade_env(build_env: dict[str, str], sdist_dir: Path, project: Path) -> dict[str, str]:
    """The suite's build environment, with the sdists as mirror and a project copy of recipes and patches."""
    require(
        (sdist_dir / OLD_SDIST).is_file() or os.environ.get("CI") == "true",
        f"{OLD_SDIST} is not in {sdist_dir} (`nox -s tests` downloads it into .ci-cache/sdist)",
    )
    return {
        **build_env,
        "LLAMAFORGE_RECIPES_DIR": str(project / "recipes"),
        "LLAMAFORGE_PATCHES_DIR": str(project / "patches"),
    }


def _json(result: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@pytest.mark.docker
@pytest.mark.llamacpp
def test_dry_run_to_an_older_release_rebases_and_changes_nothing(
    upgrade_env: dict[str, str], project: Path
) -> None:
    before = _digest(project)
    result = invoke("upgrade", "--to", "llama-cpp-python==0.3.35", "--dry-run", "--json", env=upgrade_env)
    assert result.returncode == 0, result.stderr[-3000:]
    data = _json(result)
    assert data["verdict"] == "dry run" and data["mode"] == "dry-run"
    assert data["old"]["label"] == "b11312"
    assert data["new"]["commit"] == OLD_COMMIT and data["new"]["build_number"] is None
    assert (
        data["new"]["source"]["sha256"]
        == hashlib.sha256(
            (Path(upgrade_env["LLAMAFORGE_SOURCE_MIRROR"]) / OLD_SDIST).read_bytes()
        ).hexdigest()
    )
    statuses = {patch["name"]: patch["status"] for patch in data["rebase"]["patches"]}
    assert len(statuses) == 3 and set(statuses.values()) <= {"applies", "refreshed"}, statuses
    assert data["builds"] == {} and data["smokes"] == []
    assert Path(data["files"]["report.md"]).is_file() and "report.png" not in data["files"]
    assert "**Verdict: dry run**" in Path(data["files"]["report.md"]).read_text(encoding="utf-8")
    assert _digest(project) == before  # nothing under recipes/ or patches/ changed


@pytest.mark.docker
@pytest.mark.llamacpp
@pytest.mark.anyio
async def test_a_dry_run_from_mcp_and_from_a_notebook_says_what_the_cli_says(
    upgrade_env: dict[str, str],
    project: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same dry run through the MCP server (a real client) and the notebook magic (a real IPython shell):
    the same resolved source and rebase, and nothing under recipes/ or patches/ changes."""
    from IPython.core.interactiveshell import InteractiveShell
    from mcp import Client
    from traitlets.config import Config

    from llamaforge.fronts.mcp.server import build_server

    for name in (
        "LLAMAFORGE_HOME",
        "LLAMAFORGE_SOURCE_MIRROR",
        "LLAMAFORGE_RECIPES_DIR",
        "LLAMAFORGE_PATCHES_DIR",
    ):
        monkeypatch.setenv(name, upgrade_env[name])
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path_factory.mktemp("ipython")))  # outside the project
    before = _digest(project)
    arguments = {"to": "llama-cpp-python==0.3.35", "dry_run": True}
    async with Client(build_server()) as client:
        called = await client.call_tool("upgrade", arguments)
    assert not called.is_error and called.structured_content is not None, called.content
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell.instance(config=config)
    try:
        shell.run_line_magic("load_ext", "llamaforge")
        shown = shell.run_line_magic("llamaforge", "upgrade --to llama-cpp-python==0.3.35 --dry-run")
    finally:
        InteractiveShell.clear_instance()
    for result in (called.structured_content, shown):
        assert result["verdict"] == "dry run" and result["new"]["commit"] == OLD_COMMIT
        statuses = {patch["name"]: patch["status"] for patch in result["rebase"]["patches"]}
        assert len(statuses) == 3 and set(statuses.values()) <= {"applies", "refreshed"}, statuses
    assert "dry run" in shown._repr_html_()
    assert _digest(project) == before


def _moved_context_archive(source_tree: Path, directory: Path) -> tuple[Path, str]:
    """b11312 with a line of its own where the remap patch adds one: a real 3-way conflict for the series."""
    series = (REPO / "patches" / "llama.cpp" / "0001-qwen3-tensor-name-remap.patch").read_text(
        encoding="utf-8"
    )
    target = next(
        line[6:] for line in series.splitlines() if line.startswith("+++ b/") and line.endswith(".cpp")
    )
    tree = directory / "llama.cpp"
    shutil.copytree(source_tree, tree, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    # Upstream adds its own line exactly where the patch adds one (after the context line before the patch's
    # first added line): both sides change the same spot, which no 3-way merge can decide.
    hunk = series.split(f"+++ b/{target}\n", 1)[1].split("\n")[1:]  # after the first @@ line
    first_added = next(index for index, line in enumerate(hunk) if line.startswith("+"))
    context = hunk[first_added - 1][1:]
    path = tree / target
    text = path.read_text(encoding="utf-8")
    assert text.count(context + "\n") >= 1
    path.write_text(
        text.replace(context + "\n", context + '\n#include "llama-upstream-moved.h"\n', 1), encoding="utf-8"
    )
    # Committed and archived with git, as upstream's tarballs are: the archive names its commit (a real one, of
    # this repository), which resolving the source reads.
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-C", str(tree)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A", "--force"], check=True)  # every file, whatever .gitignore says
    subprocess.run([*git, "commit", "-q", "--no-verify", "-m", "moved context"], check=True)
    archive = directory / "llama.cpp-moved.tar.gz"
    subprocess.run(
        [*git, "archive", "--format=tar.gz", "--prefix=llama.cpp/", "-o", str(archive), "HEAD"], check=True
    )
    return archive, hashlib.sha256(archive.read_bytes()).hexdigest()


@pytest.mark.docker
@pytest.mark.llamacpp
def test_a_real_conflict_names_its_hunks_then_resumes(
    upgrade_env: dict[str, str], project: Path, source_tree: Path, tmp_path: Path
) -> None:
    archive, sha = _moved_context_archive(source_tree, tmp_path)
    before = _digest(project)
    arguments = ["--to", str(archive), "--sha256", sha, "--dry-run", "--json"]
    result = invoke("upgrade", *arguments, env=upgrade_env)
    assert result.returncode == 4, result.stderr[-3000:]  # PATCH
    data = _json(result)
    assert data["verdict"] == "conflicts"
    conflict = next(patch for patch in data["rebase"]["patches"] if patch["status"] == "conflicts")
    assert conflict["name"] == "0001-qwen3-tensor-name-remap.patch"
    assert conflict["files"] and all(hunks for hunks in conflict["files"].values())
    assert "--resume" in data["next_step"] and data["rebase"]["workspace"] in data["next_step"]
    assert _digest(project) == before

    # Resolve as a person would: keep the patched side of every conflict, then go on.
    workspace = Path(data["rebase"]["workspace"])
    for name in conflict["files"]:
        path = workspace / name
        lines, keep = [], True
        for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
            if line.startswith("<<<<<<< "):
                keep = False
            elif line.startswith("=======") and not keep:
                keep = True
            elif line.startswith(">>>>>>> "):
                continue
            elif keep:
                lines.append(line)
        path.write_text("".join(lines), encoding="utf-8")
    resumed = invoke("upgrade", "--resume", data["dir"], "--dry-run", "--json", env=upgrade_env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = _json(resumed)
    statuses = {patch["name"]: patch["status"] for patch in after["rebase"]["patches"]}
    assert statuses["0001-qwen3-tensor-name-remap.patch"] == "refreshed" and after["verdict"] == "dry run"
    assert _digest(project) == before


@pytest.mark.docker
@pytest.mark.parametrize(
    ("to", "words"),
    [
        ("llama-cpp-python==0.0.999", "0.0.999"),
        ("requests==2.32.3", "vendors no llama.cpp"),
    ],
)
def test_bad_sources_are_refused_and_leave_no_run(
    to: str, words: str, upgrade_env: dict[str, str], project: Path
) -> None:
    before = _digest(project)
    result = invoke("upgrade", "--to", to, "--dry-run", env=upgrade_env)
    assert result.returncode in (2, 3), result.stderr[-3000:]
    assert words in result.stderr and "Traceback" not in result.stderr
    assert not (Path(upgrade_env["LLAMAFORGE_HOME"]) / "upgrades").exists() or not any(
        to.split("==")[1] in path.name
        for path in (Path(upgrade_env["LLAMAFORGE_HOME"]) / "upgrades").iterdir()
    )
    assert _digest(project) == before


@pytest.mark.docker
def test_a_wrong_sha256_is_refused(upgrade_env: dict[str, str], tmp_path: Path) -> None:
    archive = tmp_path / "llama.cpp.tar.gz"
    (tmp_path / "llama.cpp").mkdir()
    (tmp_path / "llama.cpp" / "CMakeLists.txt").write_text("project(x)\n", encoding="utf-8")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "llama.cpp", arcname="llama.cpp")
    result = invoke("upgrade", "--to", str(archive), "--sha256", "0" * 64, "--dry-run", env=upgrade_env)
    assert result.returncode == 3, result.stderr[-3000:]  # SOURCE (ChecksumMismatch)
    assert "sha256" in result.stderr and "Traceback" not in result.stderr


def _pin_to_0_3_35(project: Path, sdist_dir: Path) -> None:
    """The project's default recipe pinned to llama-cpp-python 0.3.35's llama.cpp, as a person would pin it:
    the sha256 of the sdist file, the commit its tree records, no build number (its shallow clone cannot say)."""
    recipe = project / "recipes" / "builds" / "default.toml"
    sha = hashlib.sha256((sdist_dir / OLD_SDIST).read_bytes()).hexdigest()
    text = recipe.read_text(encoding="utf-8")
    start, end = text.index("[source]"), text.index("\n[", text.index("[source]"))
    text = (
        text[:start]
        + "\n".join(
            [
                "[source]",
                'kind = "pypi-sdist"',
                'package = "llama-cpp-python"',
                'version = "0.3.35"',
                f'sha256 = "{sha}"',
                'subdir = "llama_cpp_python-0.3.35/vendor/llama.cpp"',
                f'commit = "{OLD_COMMIT}"',
                "date = 2026-08-16",
                "",
            ]
        )
        + text[end:]
    )
    recipe.write_text(
        text.replace("b11312", "llama.cpp 4df29be").replace("0.3.36", "0.3.35"), encoding="utf-8"
    )


@pytest.mark.docker
@pytest.mark.llamacpp
@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("LLAMAFORGE_TEST_FULL_UPGRADE") != "1",
    reason="opt-in, too long for CI: set LLAMAFORGE_TEST_FULL_UPGRADE=1 (a cold build of 0.3.35's llama.cpp; "
    "`nox -s upgrade` records its figures)",
)
def test_full_upgrade_to_b11312_with_apply(
    upgrade_env: dict[str, str], project: Path, sdist_dir: Path
) -> None:
    """From 0.3.35's llama.cpp to b11312 for real: both builds, both smokes on the quantized tiny models, the fit
    measured on both, one report with real ratios, then --apply re-pins the project's recipe."""
    _pin_to_0_3_35(project, sdist_dir)
    patches_before = _digest(project / "patches")
    arguments = [
        "--to",
        "llama-cpp-python==0.3.36",
        "--cpu",
        "baseline",
        "--repetitions",
        "2",
        "--tolerance",
        "0.5",
    ]
    result = invoke("upgrade", *arguments, "--json", env=upgrade_env)
    assert result.returncode == 0, result.stderr[-3000:]
    data = _json(result)
    assert data["verdict"] == "upgrade ok", data["reasons"]
    assert data["new"]["label"] == "b11312" and data["new"]["build_number_from"].startswith("recipe")
    assert data["builds"]["old"]["key"] != data["builds"]["new"]["key"]
    smoked = {smoke["model"] for smoke in data["smokes"]}
    assert smoked == {"tiny-qwen3-q4_0", "tiny-qwen3-q4_k_m", "tiny-qwen3moe-q4_0"}
    for smoke in data["smokes"]:
        assert smoke["old_passed"] and smoke["new_passed"]
        rows = {row["metric"]: row for row in smoke["rows"]}
        for metric in ("llama-bench pp64", "llama-bench tg32", "c=1 TTFT p50", "c=1 ITL p50"):
            assert rows[metric]["a"] > 0 and rows[metric]["b"] > 0, metric
    assert {row["category"] for row in data["fit"]} >= {"weights", "kv_cache", "compute"}
    assert all(row["old_mib"] is not None and row["new_mib"] is not None for row in data["fit"])
    assert Path(data["files"]["report.png"]).stat().st_size > 0
    assert _digest(project / "patches") == patches_before  # no --apply: nothing written
    assert "0.3.35" in (project / "recipes" / "builds" / "default.toml").read_text(encoding="utf-8")

    applied = invoke("upgrade", "--resume", data["dir"], "--apply", "--json", env=upgrade_env)
    assert applied.returncode == 0, applied.stderr[-3000:]
    after = _json(applied)
    assert after["applied"] and after["verdict"] == "upgrade ok"
    assert after["builds"]["new"]["cached"] and after["builds"]["old"]["cached"]
    text = (project / "recipes" / "builds" / "default.toml").read_text(encoding="utf-8")
    shipped = (REPO / "recipes" / "builds" / "default.toml").read_text(encoding="utf-8")
    source = lambda t: t[t.index("[source]") : t.index("\n[", t.index("[source]"))]  # noqa: E731
    assert source(text) == source(shipped).replace(
        "  # commit date: SOURCE_DATE_EPOCH for reproducible builds", ""
    )


@pytest.mark.docker
def test_a_candidate_that_does_not_build_is_broken_and_changes_nothing(
    build_env: dict[str, str], tmp_path: Path
) -> None:
    """The stand-in project moved to a 'release' whose main.c does not compile: verdict broken, the failed stage
    and the compiler's words in the result, the recipe untouched."""
    from helpers import MINI, mini_recipe

    recipe = mini_recipe(tmp_path, ["llama-cli"])
    before = recipe.read_text(encoding="utf-8")
    tree = tmp_path / "next" / "mini"
    shutil.copytree(MINI, tree)
    (tree / "include").mkdir()
    (tree / "include" / "llama.h").write_text(
        "/* the header that marks a llama.cpp tree */\n", encoding="utf-8"
    )
    (tree / "main.c").write_text("int main(void) { return no_such_symbol; }\n", encoding="utf-8")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-C", str(tree)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A", "--force"], check=True)
    subprocess.run([*git, "commit", "-q", "--no-verify", "-m", "next release"], check=True)
    archive = tmp_path / "mini-next.tar.gz"
    subprocess.run(
        [*git, "archive", "--format=tar.gz", "--prefix=mini/", "-o", str(archive), "HEAD"], check=True
    )
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()

    result = invoke(
        "upgrade", "--recipe", str(recipe), "--to", str(archive), "--sha256", sha, "--json", env=build_env
    )
    assert result.returncode == 26, result.stderr[-3000:]  # UPGRADE
    data = _json(result)
    assert data["verdict"] == "broken" and data["failure"]["stage"] == "build-new"
    assert any("no_such_symbol" in line for line in data["failure"]["log_tail"]), data["failure"]
    assert "no_such_symbol" in Path(data["files"]["report.md"]).read_text(encoding="utf-8")
    assert set(data["builds"]) == {"old"} and data["smokes"] == []
    assert "the current pin is untouched" in data["next_step"]
    assert recipe.read_text(encoding="utf-8") == before
