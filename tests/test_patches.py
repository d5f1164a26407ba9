"""The patch queue on real files with real `git apply`: order, hashes, and conflicts that name the hunk."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llamaforge.build.patches import apply_series, read_series
from llamaforge.core.errors import PatchError

pytestmark = pytest.mark.quick

ORIGINAL = "".join(f"line {n}\n" for n in range(1, 41))


def _make_patch(tmp_path: Path, name: str, edits: dict[int, str], base: str = ORIGINAL) -> Path:
    """Write a real unified diff of src/file.c made by `git diff --no-index`."""
    work = tmp_path / f"mk-{name}"
    (work / "a" / "src").mkdir(parents=True)
    (work / "b" / "src").mkdir(parents=True)
    (work / "a" / "src" / "file.c").write_text(base, encoding="utf-8")
    lines = base.splitlines(keepends=True)
    for number, text in edits.items():
        lines[number - 1] = text
    (work / "b" / "src" / "file.c").write_text("".join(lines), encoding="utf-8")
    diff = subprocess.run(
        ["git", "diff", "--no-index", "--no-prefix", "a/src/file.c", "b/src/file.c"],
        cwd=work,
        capture_output=True,
        text=True,
    ).stdout
    path = tmp_path / "series-dir" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(diff, encoding="utf-8")
    return path


def _tree(tmp_path: Path, text: str = ORIGINAL) -> Path:
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "file.c").write_text(text, encoding="utf-8")
    return tree


def test_series_applies_in_order_and_hashes(tmp_path: Path) -> None:
    _make_patch(tmp_path, "0001-first.patch", {3: "line 3 patched\n"})
    after_first = ORIGINAL.replace("line 3\n", "line 3 patched\n")
    _make_patch(tmp_path, "0002-second.patch", {3: "line 3 patched twice\n"}, base=after_first)
    series = tmp_path / "series-dir"
    (series / "series").write_text("# comment\n0001-first.patch\n\n0002-second.patch  # trailing\n")
    refs = read_series(series)
    assert [ref.name for ref in refs] == ["0001-first.patch", "0002-second.patch"]
    assert all(len(ref.sha256) == 64 for ref in refs)
    tree = _tree(tmp_path)
    apply_series(refs, tree)
    assert "line 3 patched twice\n" in (tree / "src" / "file.c").read_text()


def test_conflict_names_patch_file_and_hunk_and_removes_tree(tmp_path: Path) -> None:
    _make_patch(tmp_path, "0001-two-hunks.patch", {3: "three\n", 30: "thirty\n"})
    (tmp_path / "series-dir" / "series").write_text("0001-two-hunks.patch\n")
    moved_upstream = ORIGINAL.replace("line 30\n", "line 30 changed upstream\n")
    tree = _tree(tmp_path, moved_upstream)
    with pytest.raises(PatchError) as info:
        apply_series(read_series(tmp_path / "series-dir"), tree)
    error = info.value
    assert error.patch == "0001-two-hunks.patch"
    assert error.file == "src/file.c"
    assert error.hunk == 2
    assert "hunk #2" in error.message and "@@ -27" in error.message
    assert not tree.exists(), "a half-patched tree must not be left behind"


def test_missing_file_is_named(tmp_path: Path) -> None:
    _make_patch(tmp_path, "0001.patch", {1: "x\n"})
    (tmp_path / "series-dir" / "series").write_text("0001.patch\n")
    tree = tmp_path / "empty"
    tree.mkdir()
    with pytest.raises(PatchError) as info:
        apply_series(read_series(tmp_path / "series-dir"), tree)
    assert info.value.file == "src/file.c"


def test_listed_but_missing_patch(tmp_path: Path) -> None:
    series = tmp_path / "s"
    series.mkdir()
    (series / "series").write_text("0001-gone.patch\n")
    with pytest.raises(PatchError) as info:
        read_series(series)
    assert "0001-gone.patch" in info.value.message and "series:1" in info.value.message


def test_no_series_means_no_patches(tmp_path: Path) -> None:
    assert read_series(None) == []
    (tmp_path / "empty-series").mkdir()
    (tmp_path / "empty-series" / "series").write_text("# nothing yet\n", encoding="utf-8")
    assert read_series(tmp_path / "empty-series") == []


def test_a_directory_without_a_series_file_is_no_series(tmp_path: Path) -> None:
    """`patches.check --series /etc` passed with nothing checked: a directory is a series only with its listing."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a patch\n", encoding="utf-8")
    with pytest.raises(PatchError, match="no patch series: it has no series file") as info:
        read_series(tmp_path / "notes")
    assert info.value.hint and "patches.new" in info.value.hint
    assert read_series(tmp_path / "notes", new=True) == []  # patches.new starting a series there


def test_a_patch_listed_twice_is_named_with_both_lines(tmp_path: Path) -> None:
    """A second line for the same patch would apply it again and fail as if the patch had rotted."""
    _make_patch(tmp_path, "0001-a.patch", {3: "changed\n"})
    series = tmp_path / "series-dir"
    (series / "series").write_text("0001-a.patch\n# again\n0001-a.patch [windows]\n", encoding="utf-8")
    with pytest.raises(PatchError) as info:
        read_series(series)
    assert "series:3: patch '0001-a.patch' is listed twice (first on line 1)" in info.value.message
    assert info.value.hint and "[windows, macos]" in info.value.hint


def test_a_series_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "series").write_bytes(b"\xff\xfe\n")
    with pytest.raises(PatchError) as info:
        read_series(tmp_path / "s")
    assert f"{tmp_path / 's' / 'series'} is not UTF-8 text" in info.value.message and info.value.hint


def test_a_patch_converted_to_windows_line_endings_is_named_not_called_stale(tmp_path: Path) -> None:
    # git's core.autocrlf on Windows converts a checkout's patches: they then "no longer matched the source", with
    # the hint to refresh them.
    path = _make_patch(tmp_path, "0001-first.patch", {3: "line 3 patched\n"})
    (path.parent / "series").write_text("0001-first.patch\n")
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    with pytest.raises(PatchError) as info:
        read_series(path.parent)
    assert info.value.message == (
        f"{path.parent / 'series'}:1: patch '0001-first.patch' has Windows line endings (CRLF): a checkout or an "
        "editor converted it, and git cannot apply it to llama.cpp's LF sources"
    )
    assert f"dos2unix {path}" in (info.value.hint or "")


def test_a_patch_of_a_file_with_windows_line_endings_applies(tmp_path: Path) -> None:
    # Its hunks hold CR, its headers (written by git) do not: it is no converted patch.
    crlf = ORIGINAL.replace("\n", "\r\n")
    path = tmp_path / "series-dir" / "0001-crlf.patch"
    path.parent.mkdir()
    path.write_bytes(
        b"diff --git a/src/file.c b/src/file.c\n--- a/src/file.c\n+++ b/src/file.c\n@@ -1,4 +1,4 @@\n"
        b" line 1\r\n line 2\r\n-line 3\r\n+line 3 patched\r\n line 4\r\n"
    )
    (path.parent / "series").write_text("0001-crlf.patch\n")
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "file.c").write_bytes(crlf.encode())
    apply_series(read_series(path.parent), tree)
    assert (tree / "src" / "file.c").read_bytes().startswith(b"line 1\r\nline 2\r\nline 3 patched\r\n")


def test_the_shipped_patches_keep_their_line_endings_in_any_checkout() -> None:
    repo = Path(__file__).resolve().parents[1]
    shipped = sorted(str(path.relative_to(repo)) for path in (repo / "patches").rglob("*.patch"))
    assert shipped
    attributes = subprocess.run(
        ["git", "check-attr", "text", "--", *shipped], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert attributes == [f"{name}: text: unset" for name in shipped]
