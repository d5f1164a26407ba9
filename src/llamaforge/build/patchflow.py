"""The patch workflow: check a series against a source, refresh it onto a new llama.cpp with a 3-way merge,
and turn an edited workspace into a new patch.

Workspaces are git repositories under ``$LLAMAFORGE_HOME/patch-workspaces/``: a base commit with the pristine
source and one commit per patch, so git's merge machinery does the 3-way work and the regenerated patches are
plain ``git diff`` output (no dates, no commit hashes: the same input gives the same bytes).

git runs only in workspaces llamaforge made: each carries a marker in its ``.git`` with the sha256 of the git
configuration llamaforge wrote, and ``patches.new`` and ``patches.refresh --resume`` refuse a directory without
it, or whose configuration changed since (a configured filter, merge driver or monitor would run a command).
Every git command runs with hooks and the file-system monitor off (:mod:`llamaforge.build.git`). Edits are
committed with ``git add -A``: files the source's ``.gitignore`` ignores stay out of a new patch.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import re
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamaforge.build.git import SAFE_ENV, git_command
from llamaforge.build.patches import PatchRef, apply_series, read_series, series_dir
from llamaforge.build.source import make_workspace
from llamaforge.core.errors import LlamaforgeError, PatchError
from llamaforge.core.events import Event, Reporter, null_reporter
from llamaforge.core.paths import home, write_text_atomic
from llamaforge.runners.process import LOCAL, ProcessResult, ProcessRunner

_GIT_IDENTITY = ["-c", "user.name=llamaforge", "-c", "user.email=llamaforge@localhost"]
_FIXED_DATE = "2000-01-01T00:00:00Z"
_MARKER = "llamaforge-workspace.json"  # in the workspace's .git: never part of a diff
_DIFF = ("--no-color", "--no-ext-diff", "--no-textconv")  # no configured diff program runs


class RefreshConflict(PatchError):
    """A patch no longer applies onto the new source, even with a 3-way merge."""


@dataclass(frozen=True)
class PatchStatus:
    """One patch of a series checked against a source."""

    name: str
    sha256: str
    files: tuple[str, ...]
    hunks: int
    platforms: tuple[str, ...] = ()  # the series line's [platforms]; empty: every platform


@dataclass(frozen=True)
class ConflictReport:
    """Where a refresh stopped: the patch, and the conflicting files with their conflicting hunks."""

    patch: str
    files: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class RefreshResult:
    """Outcome of a refresh: rewritten patches, or the conflicts and the workspace to resolve them in."""

    workspace: Path
    refreshed: tuple[str, ...]
    conflicts: tuple[ConflictReport, ...]
    changed: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """Result as data."""
        return {
            "workspace": str(self.workspace),
            "refreshed": list(self.refreshed),
            "changed": list(self.changed),
            "conflicts": [{"patch": c.patch, "files": c.files} for c in self.conflicts],
            "ok": not self.conflicts,
        }


def _git(
    runner: ProcessRunner,
    workspace: Path,
    *args: str,
    check: bool = True,
    extra_env: dict[str, str] | None = None,
) -> ProcessResult:
    env = {
        **(extra_env or {}),
        **SAFE_ENV,
        "GIT_AUTHOR_DATE": _FIXED_DATE,
        "GIT_COMMITTER_DATE": _FIXED_DATE,
        "GIT_EDITOR": "true",
        "GIT_CEILING_DIRECTORIES": str(workspace.resolve().parent),
    }
    result = runner.run(git_command(*_GIT_IDENTITY, *args), cwd=workspace, env=env, warn=True)
    if check and result.exit_code != 0:
        raise LlamaforgeError(f"git {' '.join(args)} failed in {workspace}: {result.stderr.strip()}")
    return result


def _patch_stats(patch: PatchRef) -> tuple[tuple[str, ...], int]:
    text = patch.path.read_text(encoding="utf-8", errors="replace")
    files = tuple(re.findall(r"^\+\+\+ b/(\S+)", text, flags=re.M))
    return files, len(re.findall(r"^@@ ", text, flags=re.M))


def check_series(
    series: str | Path | None, tree: Path, reporter: Reporter = null_reporter, runner: ProcessRunner = LOCAL
) -> list[PatchStatus]:
    """Apply ``series`` in order to a scratch copy of ``tree`` (every platform's patches: each must apply on top
    of those before it); raise PatchError naming the first failure."""
    patches = read_series(series)
    with make_workspace(tree) as scratch:
        for index, patch in enumerate(patches, start=1):
            reporter(
                Event(
                    "progress", f"applying {patch.name}", stage="check", completed=index, total=len(patches)
                )
            )
            apply_series([patch], scratch, runner)
    return [PatchStatus(p.name, p.sha256, *_patch_stats(p), platforms=p.platforms) for p in patches]


def _copy_tree(source: Path, target: Path) -> None:
    for entry in target.iterdir():
        if entry.name != ".git":
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    for entry in source.iterdir():
        if entry.name == ".git":
            continue
        destination = target / entry.name
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, destination, symlinks=True)
        else:
            shutil.copy2(entry, destination, follow_symlinks=False)


def resolve_tree(spec: str, scratch: Path) -> Path:
    """A llama.cpp source tree from ``spec``: a directory, or a .tar/.tar.gz/.tar.xz archive (extracted into
    scratch); a damaged archive or a tree without llama.cpp's top-level files is refused."""
    path = Path(spec).expanduser()
    tree = path if path.is_dir() else _extracted(path, scratch) if path.is_file() else None
    if tree is None:
        raise LlamaforgeError(
            f"--to {spec!r} is neither a source directory nor a tar archive",
            hint="pass an extracted llama.cpp tree or its release archive (git commits: fetch them with "
            "`git archive` or a recipe first)",
        )
    missing = [name for name in ("CMakeLists.txt", "include/llama.h") if not (tree / name).is_file()]
    if missing:
        raise LlamaforgeError(
            f"--to {spec!r} is no llama.cpp source tree: it has no {' and no '.join(missing)}",
            hint="pass the top directory of an extracted llama.cpp tree, or its release archive",
        )
    return tree


def _extracted(archive: Path, scratch: Path) -> Path | None:
    """The tree in ``archive`` extracted into ``scratch`` (the one top-level directory it usually has), or None
    when it is no tar archive."""
    target = scratch / "upstream"
    try:
        if not tarfile.is_tarfile(archive):
            return None
        target.mkdir()
        with tarfile.open(archive) as tar:
            tar.extractall(target, filter="data")
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as error:
        raise LlamaforgeError(
            f"--to {str(archive)!r} cannot be extracted: {error}",
            hint="the archive is damaged or unsafe; fetch the release archive again",
        ) from None
    entries = list(target.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else target


def _workspace_root() -> Path:
    root = home() / "patch-workspaces"
    root.mkdir(parents=True, exist_ok=True)
    return root


def create_workspace(
    tree: Path,
    patches: list[PatchRef],
    name: str,
    runner: ProcessRunner = LOCAL,
    *,
    source: WorkspaceSource | None = None,
) -> Path:
    """A git workspace: commit ``base`` = ``tree``, then one commit per patch (branch ``patched``); one that
    could not be made whole (a patch does not apply) is removed, not left half-made. ``source`` (the recipe's
    pin of ``tree``) is kept in its marker, for ``patches.new`` to refuse the workspace for another pin."""
    workspace = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=_workspace_root()))
    try:
        _fill_workspace(workspace, tree, patches, runner, source)
    except BaseException:
        shutil.rmtree(workspace, ignore_errors=True)
        raise
    return workspace


def _fill_workspace(
    workspace: Path,
    tree: Path,
    patches: list[PatchRef],
    runner: ProcessRunner,
    source: WorkspaceSource | None,
) -> None:
    _copy_tree(tree, workspace)
    _git(runner, workspace, "init", "-q", "-b", "patched")
    _mark_workspace(workspace, source)
    _git(runner, workspace, "add", "-A")
    _git(runner, workspace, "commit", "-q", "--allow-empty", "-m", "base")
    _git(runner, workspace, "tag", "base")
    for patch in patches:
        apply = ("apply", "--index", "--whitespace=nowarn", str(patch.path.resolve()))
        applied = _git(runner, workspace, *apply, check=False)
        if applied.exit_code != 0:
            raise PatchError(
                f"patch {patch.name} does not apply to the current source: {applied.stderr.strip()}",
                patch=patch.name,
                hint="run `invoke patches.check` to see where it fails",
            )
        _git(runner, workspace, "commit", "-q", "--allow-empty", "-m", patch.name)


def _config_sha256(workspace: Path) -> str:
    return hashlib.sha256((workspace / ".git" / "config").read_bytes()).hexdigest()


@dataclass(frozen=True)
class WorkspaceSource:
    """The pinned source a workspace was made of: its content address and the release it is (``bNNNN``)."""

    id: str
    label: str


def _mark_workspace(workspace: Path, source: WorkspaceSource | None = None) -> None:
    """Mark ``workspace`` as llamaforge's, with the sha256 of the git configuration ``git init`` wrote and the
    source it holds."""
    marker: dict[str, Any] = {"made_by": "llamaforge", "git_config_sha256": _config_sha256(workspace)}
    if source is not None:
        marker["source"] = {"id": source.id, "label": source.label}
    (workspace / ".git" / _MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")


def _check_workspace_source(workspace: Path, source: WorkspaceSource) -> None:
    """Refuse ``workspace`` when its marker names another pinned source than ``source``: its diff would be made
    against another llama.cpp. A workspace made without a pin (a refresh's, an older one) is not checked."""
    marker = json.loads((workspace / ".git" / _MARKER).read_text(encoding="utf-8"))
    made = marker.get("source")
    if isinstance(made, dict) and made.get("id") != source.id:
        raise LlamaforgeError(
            f"{workspace} holds llama.cpp {made.get('label')}, but the recipe pins {source.label}; a patch made "
            "there is made against the other source",
            hint="make a workspace of the pinned source (`invoke patches.edit`, with the same --recipe), copy "
            "your edits into it, then run patches.new there",
        )


def require_workspace(workspace: Path) -> None:
    """Refuse ``workspace`` unless llamaforge made it and its git configuration is the one it wrote."""
    git_dir = workspace / ".git"
    try:
        marker = json.loads((git_dir / _MARKER).read_text(encoding="utf-8"))
        mine = isinstance(marker, dict) and not git_dir.is_symlink() and not (git_dir / "commondir").exists()
    except (OSError, ValueError):
        mine = False
    if not mine:
        raise LlamaforgeError(
            f"{workspace} is not a patch workspace made by llamaforge (no .git/{_MARKER})",
            hint="make one with `invoke patches.edit` (a refresh makes its own); llamaforge runs git only in "
            "its own workspaces",
        )
    try:
        unchanged = marker.get("git_config_sha256") == _config_sha256(workspace)
    except OSError:
        unchanged = False
    if not unchanged:
        raise LlamaforgeError(
            f"the git configuration of {workspace} changed since llamaforge made the workspace",
            hint="a configured command (filter, merge driver, monitor) could run; make a new workspace with "
            "`invoke patches.edit` and copy your edits into it",
        )


def _conflict_hunks(runner: ProcessRunner, workspace: Path) -> dict[str, list[str]]:
    files = _git(runner, workspace, "diff", "--name-only", "--diff-filter=U").stdout.split()
    report: dict[str, list[str]] = {}
    for name in files:
        hunks = []
        text = (workspace / name).read_text(encoding="utf-8", errors="replace").splitlines()
        for number, line in enumerate(text, start=1):
            if line.startswith("<<<<<<< "):
                hunks.append(f"conflict at line {number}")
        report[name] = hunks or ["conflict (binary or deleted file)"]
    return report


def _header(original: str) -> str:
    """Everything before the first ``diff --git`` line: the patch's description, kept across refreshes."""
    index = original.find("diff --git ")
    return original[:index] if index > 0 else ""


def _render_patch(runner: ProcessRunner, workspace: Path, revision: str, original: str) -> str:
    diff = _git(
        runner,
        workspace,
        "diff",
        *_DIFF,
        "--no-renames",
        "--src-prefix=a/",
        "--dst-prefix=b/",
        "-U3",
        f"{revision}~1",
        revision,
    ).stdout
    # `index <blob>..<blob>` lines carry content hashes that say nothing to git apply; drop them for clean diffs.
    diff = "".join(line for line in diff.splitlines(keepends=True) if not line.startswith("index "))
    return _header(original) + diff


def refresh_series(
    series: str | Path,
    old_tree: Path,
    new_tree: Path,
    *,
    reporter: Reporter = null_reporter,
    runner: ProcessRunner = LOCAL,
) -> RefreshResult:
    """Re-apply ``series`` (made for ``old_tree``) onto ``new_tree`` with 3-way merges and rewrite the patches.

    On conflicts nothing in the series is rewritten; the workspace is left at the first conflicting patch
    (``git status`` shows the files), and every conflicting patch is reported.
    """
    patches = read_series(series)
    directory = series_dir(series)
    workspace = create_workspace(old_tree, patches, "refresh", runner)
    _git(runner, workspace, "checkout", "-q", "-b", "upstream", "base")
    _copy_tree(new_tree, workspace)
    _git(runner, workspace, "add", "-A")
    _git(runner, workspace, "commit", "-q", "--allow-empty", "-m", "new upstream")
    _git(runner, workspace, "checkout", "-q", "-b", "refreshed")

    conflicts: list[ConflictReport] = []
    commits = _git(runner, workspace, "rev-list", "--reverse", "base..patched").stdout.split()
    for index, (patch, commit) in enumerate(zip(patches, commits, strict=True), start=1):
        reporter(
            Event("progress", f"merging {patch.name}", stage="refresh", completed=index, total=len(patches))
        )
        if _git(runner, workspace, "cherry-pick", "--allow-empty", commit, check=False).exit_code == 0:
            continue
        # Record the conflict, then go on without this patch so every conflicting patch gets reported.
        conflicts.append(ConflictReport(patch.name, _conflict_hunks(runner, workspace)))
        _git(runner, workspace, "cherry-pick", "--abort", check=False)
    if conflicts:
        _restore_first_conflict(runner, workspace, patches, commits, conflicts[0].patch)
        return RefreshResult(workspace, (), tuple(conflicts), ())

    return _rewrite(runner, directory, patches, workspace)


def _rewrite(
    runner: ProcessRunner, directory: Path, patches: list[PatchRef], workspace: Path
) -> RefreshResult:
    """Regenerate every patch from the ``refreshed`` branch; only files whose bytes change are written."""
    changed: list[str] = []
    revisions = _git(runner, workspace, "rev-list", "--reverse", "upstream..refreshed").stdout.split()
    for patch, revision in zip(patches, revisions, strict=True):
        original = patch.path.read_text(encoding="utf-8")
        rendered = _render_patch(runner, workspace, revision, original)
        if rendered != original:
            changed.append(patch.name)
            # A plain name (read_series), replaced whole: a link in the directory is replaced, not followed.
            write_text_atomic(directory / patch.name, rendered)
    return RefreshResult(workspace, tuple(p.name for p in patches), (), tuple(changed))


def continue_refresh(
    series: str | Path, workspace: Path, *, reporter: Reporter = null_reporter, runner: ProcessRunner = LOCAL
) -> RefreshResult:
    """After the user resolved a conflict in ``workspace``: finish that patch, merge the rest, rewrite."""
    require_workspace(workspace)
    state_file = workspace / ".git" / "llamaforge-refresh.json"
    if not state_file.is_file():
        raise LlamaforgeError(
            f"{workspace} has no refresh in progress", hint="start one with `patches.refresh --to`"
        )
    state = json.loads(state_file.read_text(encoding="utf-8"))
    _git(runner, workspace, "add", "-A")
    if _conflict_hunks(runner, workspace) or re.search(
        r"^<<<<<<< ", _git(runner, workspace, "diff", *_DIFF, "--cached").stdout, re.M
    ):
        raise LlamaforgeError(
            f"{workspace} still has conflict markers", hint="resolve every <<<<<<< block, then continue"
        )
    _git(runner, workspace, "-c", "core.editor=true", "cherry-pick", "--continue", check=False)
    if _git(runner, workspace, "rev-parse", "-q", "--verify", "CHERRY_PICK_HEAD", check=False).exit_code == 0:
        _git(runner, workspace, "commit", "-q", "--allow-empty", "-m", state["stopped_at"])
    patches = read_series(series)
    commits = _git(runner, workspace, "rev-list", "--reverse", "base..patched").stdout.split()
    remaining = set(state["remaining"])
    for index, (patch, commit) in enumerate(zip(patches, commits, strict=True), start=1):
        if patch.name not in remaining:
            continue
        reporter(
            Event("progress", f"merging {patch.name}", stage="refresh", completed=index, total=len(patches))
        )
        if _git(runner, workspace, "cherry-pick", "--allow-empty", commit, check=False).exit_code != 0:
            rest = [p.name for p in patches[index:]]
            state_file.write_text(json.dumps({"stopped_at": patch.name, "remaining": rest}), encoding="utf-8")
            return RefreshResult(
                workspace, (), (ConflictReport(patch.name, _conflict_hunks(runner, workspace)),), ()
            )
    state_file.unlink()
    return _rewrite(runner, series_dir(series), patches, workspace)


def _restore_first_conflict(
    runner: ProcessRunner, workspace: Path, patches: list[PatchRef], commits: list[str], name: str
) -> None:
    """Rebuild the ``refreshed`` branch up to the first conflicting patch and leave its merge in progress."""
    _git(runner, workspace, "checkout", "-q", "-B", "refreshed", "upstream")
    for patch, commit in zip(patches, commits, strict=True):
        picked = _git(runner, workspace, "cherry-pick", commit, check=False)
        if patch.name == name:
            state = {"stopped_at": name, "remaining": [p.name for p in patches[patches.index(patch) + 1 :]]}
            (workspace / ".git" / "llamaforge-refresh.json").write_text(json.dumps(state), encoding="utf-8")
            return
        if picked.exit_code != 0:  # pragma: no cover - earlier patches merged cleanly in the first pass
            return


def _series_made(runner: ProcessRunner, workspace: Path, patches: list[PatchRef]) -> bool:
    """Whether the workspace's committed patches change the source as ``patches`` do (another series may use
    the same file names): the series is applied to ``base`` in a scratch index and the trees compared."""
    index = workspace / ".git" / "llamaforge-series-index"
    scratch = {"GIT_INDEX_FILE": str(index.resolve())}
    try:
        _git(runner, workspace, "read-tree", "base", extra_env=scratch)
        for patch in patches:
            applied = _git(
                runner,
                workspace,
                "apply",
                "--cached",
                "--whitespace=nowarn",
                str(patch.path.resolve()),
                check=False,
                extra_env=scratch,
            )
            if applied.exit_code != 0:
                return False
        series = _git(runner, workspace, "write-tree", extra_env=scratch).stdout.strip()
    finally:
        index.unlink(missing_ok=True)
    return series == _git(runner, workspace, "rev-parse", "HEAD^{tree}").stdout.strip()


def new_patch(
    series: str | Path,
    workspace: Path,
    name: str,
    runner: ProcessRunner = LOCAL,
    *,
    source: WorkspaceSource | None = None,
) -> Path:
    """Write the uncommitted changes of ``workspace`` as ``NNNN-name.patch`` at the end of ``series`` (refused
    when the workspace was made of another pinned source than ``source``)."""
    directory = series_dir(series)
    require_workspace(workspace)
    if source is not None:
        _check_workspace_source(workspace, source)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name):
        raise LlamaforgeError(
            f"patch name {name!r} is not a plain file name", hint="e.g. qwen35-fix (at most 100 characters)"
        )
    # The series is read before the workspace changes: a broken one is refused with the edits untouched.
    existing = read_series(directory, new=True)
    numbers = [int(m.group(1)) for p in existing if (m := re.match(r"(\d+)-", p.name))]
    taken = [
        p.name for p in existing if p.name in (name, f"{name}.patch") or p.name.endswith(f"-{name}.patch")
    ]
    if taken:
        raise LlamaforgeError(
            f"patch name {name!r} is taken: the series has {taken[0]}",
            hint="choose another name (a patch already in the series is changed by editing its file)",
        )
    filename = f"{(max(numbers) if numbers else 0) + 1:04d}-{name}.patch"
    if (directory / filename).exists():
        raise LlamaforgeError(
            f"{directory / filename} exists and is not in the series",
            hint="add it to the series file, or remove it, then run patches.new again",
        )
    # Commits llamaforge did not make would be left out of the patch without a word: patches.new takes edits.
    authors = _git(runner, workspace, "log", "--format=%an", "base..HEAD").stdout.split("\n")
    own = sum(1 for author in authors if author.strip() and author != "llamaforge")
    if own:
        raise LlamaforgeError(
            f"{workspace} has {own} commit(s) of your own; patches.new turns uncommitted edits into a patch",
            hint=f"undo the commit(s) and keep their changes (`git -C {workspace} reset --soft HEAD~{own}` "
            "when they are the last ones), then run patches.new again",
        )
    # The diff is made against the workspace's patches: written to another series, it would not apply there.
    made = _git(runner, workspace, "log", "--reverse", "--format=%s", "base..HEAD").stdout.split()
    listed = [patch.name for patch in existing]
    other = ""
    if made != listed:
        names = f"{', '.join(made) or 'no patches'}) than {directory} ({', '.join(listed) or 'no patches'}"
        other = f"another series ({names})"
    elif not _series_made(runner, workspace, existing):
        other = f"patches named as in {directory} that change the source otherwise (another series, or edited since)"
    if other:
        raise LlamaforgeError(
            f"{workspace} was made with {other}; a patch made there would not apply to this series",
            hint=f"make a workspace of this series (`invoke patches.edit --series {directory}`), copy your edits "
            "into it, then run patches.new there",
        )
    _git(runner, workspace, "add", "-A")
    # --numstat counts "-" lines for a binary file: its diff would be "Binary files differ", which no
    # `git apply` can apply.
    numstat = _git(runner, workspace, "diff", *_DIFF, "--cached", "--numstat").stdout.splitlines()
    if not numstat:
        raise LlamaforgeError(f"no changes in {workspace}", hint="edit the source in the workspace first")
    binary = [line.split("\t", 2)[2] for line in numstat if line.startswith("-\t-\t")]
    if binary:
        raise LlamaforgeError(
            f"{workspace} changes binary file(s): {', '.join(binary)}; a patch holds text changes only",
            hint="undo the binary change (or keep that file outside the source tree), then run patches.new again",
        )
    _git(runner, workspace, "commit", "-q", "-m", filename)  # named like the workspace's other patches
    try:
        header = f"From: llamaforge patches.new\nSubject: {name}\n\n"
        # _render_patch keeps the description of an existing patch; a new one has none yet, so it goes first
        write_text_atomic(directory / filename, header + _render_patch(runner, workspace, "HEAD", ""))
        listing = directory / "series"
        current = listing.read_text(encoding="utf-8") if listing.is_file() else ""
        write_text_atomic(
            listing, current + ("" if current.endswith("\n") or not current else "\n") + filename + "\n"
        )
    except BaseException:
        # nothing half-made: no patch file, and the edits back as uncommitted changes for the next try
        (directory / filename).unlink(missing_ok=True)
        _git(runner, workspace, "reset", "-q", "HEAD~1")
        raise
    return directory / filename
