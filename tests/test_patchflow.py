"""The patch workflow against a synthetic upstream that moves: check, refresh (clean and conflicting), new."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from llamaforge.build.patches import read_series
from llamaforge.build.patchflow import (
    WorkspaceSource,
    check_series,
    continue_refresh,
    create_workspace,
    new_patch,
    refresh_series,
    resolve_tree,
)
from llamaforge.core.errors import LlamaforgeError, PatchError

pytestmark = pytest.mark.quick

FILE = "".join(f"int f{n}(void) {{ return {n}; }}\n" for n in range(1, 41))
OTHER = "".join(f"// other {n}\n" for n in range(1, 21))


def _tree(root: Path, file_text: str = FILE, other_text: str = OTHER) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "file.c").write_text(file_text)
    (root / "src" / "other.c").write_text(other_text)
    return root


def _diff(tmp: Path, relative: str, before: str, after: str) -> str:
    work = tmp / "diffwork"
    shutil.rmtree(work, ignore_errors=True)
    for side, text in (("a", before), ("b", after)):
        (work / side / Path(relative).parent).mkdir(parents=True)
        (work / side / relative).write_text(text)
    diff = subprocess.run(
        ["git", "diff", "--no-index", "--no-prefix", f"a/{relative}", f"b/{relative}"],
        cwd=work,
        capture_output=True,
        text=True,
    ).stdout
    return "".join(line for line in diff.splitlines(keepends=True) if not line.startswith("index "))


@pytest.fixture
def series(tmp_path: Path) -> Path:
    directory = tmp_path / "series"
    directory.mkdir()
    one = FILE.replace("return 5;", "return 500;")
    (directory / "0001-five.patch").write_text("Subject: five\n\n" + _diff(tmp_path, "src/file.c", FILE, one))
    two = OTHER.replace("// other 10\n", "// other 10 patched\n")
    (directory / "0002-other.patch").write_text(_diff(tmp_path, "src/other.c", OTHER, two))
    (directory / "series").write_text("0001-five.patch\n0002-other.patch\n")
    return directory


def test_check_series_reports_each_patch(series: Path, tmp_path: Path, lf_home: Path) -> None:
    statuses = check_series(series, _tree(tmp_path / "v1"))
    assert [(s.name, s.files, s.hunks) for s in statuses] == [
        ("0001-five.patch", ("src/file.c",), 1),
        ("0002-other.patch", ("src/other.c",), 1),
    ]


def test_refresh_onto_moved_upstream_rewrites_deterministically(
    series: Path, tmp_path: Path, lf_home: Path
) -> None:
    v1 = _tree(tmp_path / "v1")
    moved = "#include <stdio.h>\n/* upstream added lines */\n\n" + FILE
    v2 = _tree(tmp_path / "v2", moved, OTHER.replace("// other 18\n", "// other 18 upstream\n"))
    with pytest.raises(PatchError):
        check_series(series, _tree(tmp_path / "v3", moved.replace("return 5;", "return 5 ;")))
    result = refresh_series(series, v1, v2)
    assert result.conflicts == ()
    assert result.changed == ("0001-five.patch",)  # its hunk moved by three lines
    text = (series / "0001-five.patch").read_text()
    assert text.startswith("Subject: five\n\n"), "the patch description survives a refresh"
    assert "@@ -5,7 +5,7 @@" in text and "index " not in text
    check_series(series, v2)
    snapshot = {p.name: p.path.read_bytes() for p in read_series(series)}
    again = refresh_series(series, v2, v2)  # same input, same bytes
    assert again.changed == ()
    assert {p.name: p.path.read_bytes() for p in read_series(series)} == snapshot


def test_refresh_conflict_reports_patch_and_hunk_then_continue(
    series: Path, tmp_path: Path, lf_home: Path
) -> None:
    v1 = _tree(tmp_path / "v1")
    clash = FILE.replace("return 5;", "return 5 + upstream;")
    v2 = _tree(tmp_path / "v2", clash, OTHER.replace("// other 10\n", "// other 10 upstream\n"))
    before = {p.name: p.path.read_bytes() for p in read_series(series)}
    result = refresh_series(series, v1, v2)
    assert [c.patch for c in result.conflicts] == ["0001-five.patch", "0002-other.patch"]
    assert list(result.conflicts[0].files) == ["src/file.c"]
    assert result.conflicts[0].files["src/file.c"][0].startswith("conflict at line")
    assert {p.name: p.path.read_bytes() for p in read_series(series)} == before, (
        "nothing rewritten on conflict"
    )
    conflicted = (result.workspace / "src" / "file.c").read_text()
    assert "<<<<<<< " in conflicted
    # The user resolves the first conflict in the workspace and continues; the second one then stops it.
    lines = conflicted.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("<<<<<<< "))
    end = next(i for i, line in enumerate(lines) if line.startswith(">>>>>>> "))
    lines[start : end + 1] = ["int f5(void) { return 500 + upstream; }\n"]
    (result.workspace / "src" / "file.c").write_text("".join(lines))
    second = continue_refresh(series, result.workspace)
    assert [c.patch for c in second.conflicts] == ["0002-other.patch"]
    other = (result.workspace / "src" / "other.c").read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(other) if line.startswith("<<<<<<< "))
    end = next(i for i, line in enumerate(other) if line.startswith(">>>>>>> "))
    other[start : end + 1] = ["// other 10 upstream, patched\n"]
    (result.workspace / "src" / "other.c").write_text("".join(other))
    done = continue_refresh(series, result.workspace)
    assert done.conflicts == () and set(done.changed) == {"0001-five.patch", "0002-other.patch"}
    check_series(series, v2)
    with pytest.raises(PatchError):
        check_series(series, v1)


def test_new_patch_from_edited_workspace(series: Path, tmp_path: Path, lf_home: Path) -> None:
    v1 = _tree(tmp_path / "v1")
    workspace = create_workspace(v1, read_series(series), "edit")
    assert "return 500;" in (workspace / "src" / "file.c").read_text()
    text = (workspace / "src" / "file.c").read_text().replace("return 40;", "return 4000;")
    (workspace / "src" / "file.c").write_text(text)
    path = new_patch(series, workspace, "forty")
    assert path.name == "0003-forty.patch"
    assert (series / "series").read_text().splitlines()[-1] == "0003-forty.patch"
    check_series(series, v1)


def test_a_refused_new_patch_keeps_the_edits_for_the_next_try(
    series: Path, tmp_path: Path, lf_home: Path
) -> None:
    v1 = _tree(tmp_path / "v1")
    workspace = create_workspace(v1, read_series(series), "edit")
    text = (workspace / "src" / "file.c").read_text().replace("return 40;", "return 4000;")
    (workspace / "src" / "file.c").write_text(text)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "series").write_text("0001-missing.patch\n")
    with pytest.raises(PatchError):
        new_patch(broken, workspace, "forty")  # a series that lists a missing patch
    with pytest.raises(LlamaforgeError, match="is not a plain file name"):
        new_patch(series, workspace, "a" * 300)  # longer than a file name may be
    (series / "0003-forty.patch").write_text("left over\n")
    with pytest.raises(LlamaforgeError, match="exists and is not in the series"):
        new_patch(series, workspace, "forty")
    (series / "0003-forty.patch").unlink()
    path = new_patch(series, workspace, "forty")  # the edits were still there
    assert "return 4000;" in path.read_text()
    assert list(broken.iterdir()) == [broken / "series"]


def test_refresh_sources_that_are_no_llamacpp_tree_are_refused(tmp_path: Path, lf_home: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    llama = tmp_path / "llama.cpp"
    (llama / "include").mkdir(parents=True)
    (llama / "CMakeLists.txt").write_text("project(llama)\n")
    (llama / "include" / "llama.h").write_text("// llama\n")
    archive = tmp_path / "llama.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(llama, arcname="llama.cpp-b1")
    assert (resolve_tree(str(archive), scratch) / "include" / "llama.h").is_file()
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    empty = tmp_path / "empty"
    empty.mkdir()
    for spec, words in ((truncated, "cannot be extracted"), (empty, "is no llama.cpp source tree")):
        other = tmp_path / f"scratch-{spec.name}"
        other.mkdir()
        with pytest.raises(LlamaforgeError, match=words):
            resolve_tree(str(spec), other)


def test_a_workspace_whose_patch_does_not_apply_is_not_left_behind(
    series: Path, tmp_path: Path, lf_home: Path
) -> None:
    moved = _tree(tmp_path / "moved", FILE.replace("return 5;", "return 5 ;"))
    with pytest.raises(PatchError, match=r"0001-five\.patch does not apply"):
        create_workspace(moved, read_series(series), "edit")
    assert not list((lf_home / "patch-workspaces").iterdir())


def test_new_patch_writes_its_subject_and_refuses_a_name_the_series_has(
    series: Path, tmp_path: Path, lf_home: Path
) -> None:
    workspace = create_workspace(_tree(tmp_path / "v1"), read_series(series), "edit")
    (workspace / "src" / "new.c").write_text("int g(void) { return 1; }\n")  # an untracked new file
    path = new_patch(series, workspace, "forty")
    assert path.read_text().startswith(
        "From: llamaforge patches.new\nSubject: forty\n\ndiff --git a/src/new.c"
    )
    (workspace / "src" / "new.c").write_text("int g(void) { return 2; }\n")
    for taken in ("forty", "five", "0002-other"):
        with pytest.raises(LlamaforgeError, match=f"patch name '{taken}' is taken"):
            new_patch(series, workspace, taken)
    assert (series / "series").read_text() == "0001-five.patch\n0002-other.patch\n0003-forty.patch\n"


def test_new_patch_refuses_binary_changes_and_commits_of_your_own(
    series: Path, tmp_path: Path, lf_home: Path
) -> None:
    v1 = _tree(tmp_path / "v1")
    workspace = create_workspace(v1, read_series(series), "edit")
    listing = (series / "series").read_text()
    (workspace / "src" / "blob.bin").write_bytes(b"\0\1\2")
    with pytest.raises(LlamaforgeError, match=r"changes binary file\(s\): src/blob\.bin") as info:
        new_patch(series, workspace, "blob")  # its diff would say "Binary files differ": no patch applies it
    assert info.value.hint and "undo the binary change" in info.value.hint
    (workspace / "src" / "blob.bin").unlink()
    text = (workspace / "src" / "file.c").read_text().replace("return 40;", "return 4000;")
    (workspace / "src" / "file.c").write_text(text)
    identity = [
        "-c",
        "user.name=someone",
        "-c",
        "user.email=someone@example.org",
        "-c",
        "core.hooksPath=/dev/null",
    ]
    subprocess.run(["git", *identity, "commit", "-qam", "mine"], cwd=workspace, check=True)
    with pytest.raises(LlamaforgeError, match="1 commit\\(s\\) of your own") as info:
        new_patch(series, workspace, "forty")  # the commit would be left out: "no changes" said nothing of it
    assert info.value.hint and "reset --soft HEAD~1" in info.value.hint
    assert (series / "series").read_text() == listing and sorted(p.name for p in series.iterdir()) == [
        "0001-five.patch",
        "0002-other.patch",
        "series",
    ]
    subprocess.run(["git", "reset", "-q", "--soft", "HEAD~1"], cwd=workspace, check=True)
    assert "return 4000;" in new_patch(series, workspace, "forty").read_text()
    check_series(series, v1)


def test_new_patch_refuses_a_workspace_made_with_another_series(
    series: Path, tmp_path: Path, lf_home: Path
) -> None:
    workspace = create_workspace(_tree(tmp_path / "v1"), read_series(series), "edit")
    text = (workspace / "src" / "file.c").read_text().replace("return 500;", "return 5000;")
    (workspace / "src" / "file.c").write_text(text)
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(LlamaforgeError, match="was made with another series") as info:
        new_patch(other, workspace, "five-more")  # its diff starts from 0001-five: it would not apply there
    assert info.value.hint and f"patches.edit --series {other}" in info.value.hint
    assert list(other.iterdir()) == []
    assert new_patch(series, workspace, "five-more").name == "0003-five-more.patch"


def test_new_patch_refuses_a_series_of_the_same_names_that_patches_otherwise(
    series: Path, tmp_path: Path, lf_home: Path
) -> None:
    """Names alone passed: a series whose 0001-five.patch changes another line got a patch made on top of this
    one's, which does not apply there."""
    workspace = create_workspace(_tree(tmp_path / "v1"), read_series(series), "edit")
    text = (workspace / "src" / "file.c").read_text().replace("return 7;", "return 70;")
    (workspace / "src" / "file.c").write_text(text)
    other = tmp_path / "other"
    shutil.copytree(series, other)
    edited = FILE.replace("return 6;", "return 600;")
    (other / "0001-five.patch").write_text("Subject: five\n\n" + _diff(tmp_path, "src/file.c", FILE, edited))
    before = {path.name: path.read_text() for path in other.iterdir()}
    with pytest.raises(LlamaforgeError, match=r"patches named as in .* that change the source otherwise"):
        new_patch(other, workspace, "seven")
    assert {path.name: path.read_text() for path in other.iterdir()} == before
    assert new_patch(series, workspace, "seven").name == "0003-seven.patch"  # its own series still takes it


def test_new_patch_refuses_a_workspace_of_another_pinned_source(
    series: Path, tmp_path: Path, lf_home: Path
) -> None:
    """A workspace keeps the pin it was made of: its diff, written to a series of another pin, starts from
    another llama.cpp."""
    made = WorkspaceSource("1" * 64, "b11312")
    workspace = create_workspace(_tree(tmp_path / "v1"), read_series(series), "edit", source=made)
    text = (workspace / "src" / "file.c").read_text().replace("return 40;", "return 4000;")
    (workspace / "src" / "file.c").write_text(text)
    listing = (series / "series").read_text()
    with pytest.raises(LlamaforgeError, match=r"holds llama\.cpp b11312, but the recipe pins b11400") as info:
        new_patch(series, workspace, "forty", source=WorkspaceSource("2" * 64, "b11400"))
    assert info.value.hint and "patches.edit" in info.value.hint
    assert (series / "series").read_text() == listing and len(list(series.iterdir())) == 3
    assert new_patch(series, workspace, "forty", source=made).name == "0003-forty.patch"
