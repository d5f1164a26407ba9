"""Paths named inside files (recipes, manifests, inventories, matrices, series files) go through the same path
policy as arguments; git runs with hooks and fsmonitor off, only in llamaforge's own workspaces, and never
commits ignored files; names that become command-line arguments never start with '-'.

The policy is a real HostGuard installed for the test (as the MCP server installs its own) that refuses every
path outside a temporary root and the shipped data directories."""

from __future__ import annotations

import http.server
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamaforge.build.execute import recipe_from_manifest
from llamaforge.build.git import git_command
from llamaforge.build.images import bootstrap_image, check_bootstrap_inputs
from llamaforge.build.matrix import load_matrix
from llamaforge.build.patches import read_series
from llamaforge.build.patchflow import (
    _mark_workspace,
    continue_refresh,
    create_workspace,
    new_patch,
    refresh_series,
)
from llamaforge.build.recipes import ArchiveSource, GitSource, load_recipe
from llamaforge.build.source import fetch_source
from llamaforge.core import guard
from llamaforge.core.errors import InvalidOption, LlamaforgeError, PatchError, RecipeError, SourceError
from llamaforge.core.guard import HostGuard, PolicyRefused
from llamaforge.core.paths import data_dir
from llamaforge.deploy.hosts.inventory import inventory_hosts
from llamaforge.runners.process import LOCAL

pytestmark = pytest.mark.quick

COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
SHA = "a" * 64


@pytest.fixture
def allowed(tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    """A guard whose path policy allows only ``tmp_path/allowed`` and the shipped recipes and patches; yields
    that root and the ``what`` of every path it was asked about. The default guard is restored afterwards."""
    root = tmp_path / "allowed"
    root.mkdir()
    roots = [root.resolve(), data_dir("recipes").resolve(), data_dir("patches").resolve()]
    asked: list[str] = []

    def check(what: str, path: str) -> None:
        asked.append(what)
        resolved = Path(path).resolve()
        if not any(resolved.is_relative_to(allowed_root) for allowed_root in roots):
            raise PolicyRefused(f"{what}: {path} is outside the allowed roots", hint="allow it")

    guard.install(HostGuard(path_check=check))
    try:
        yield root, asked
    finally:
        guard.install(HostGuard())


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _source(kind: str, url: str) -> str:
    sha = f'sha256 = "{SHA}"\n' if kind == "archive" else ""
    return f'[source]\nkind = "{kind}"\nurl = "{url}"\n{sha}commit = "{COMMIT}"\nbuild_number = 1\n'


def _recipe(root: Path, *, patches: str | None = None, kind: str = "archive", url: str | None = None) -> Path:
    series = root / "series"
    series.mkdir(exist_ok=True)
    text = f'patches = "{patches or series}"\n' + _source(kind, url or str(root / "src.tar.gz"))
    return _write(root / "recipes" / "r.toml", text)


# Recipes


def test_a_recipe_inside_the_allowed_roots_and_the_shipped_ones_load(allowed: tuple[Path, list[str]]) -> None:
    root, asked = allowed
    path = _recipe(root)
    recipe = load_recipe(str(path))
    assert recipe.patches == str(root / "series")
    assert asked == [f"recipe {path}: patches", f"recipe {path}: source.url"]
    for name in ("default", "github"):
        load_recipe(name)  # the shipped series is under the shipped patches; github's source is remote


@pytest.mark.parametrize(
    ("field", "settings"),
    [
        ("patches", {"patches": "/etc"}),
        ("patches", {"patches": "../../outside-series"}),
        ("source.url", {"url": "/etc/passwd"}),
        ("source.url", {"url": "file:///etc/shadow"}),
        ("source.url", {"url": "~/.ssh/id_ed25519"}),
        ("source.url", {"kind": "git", "url": "/root/.ssh"}),
        ("source.url", {"kind": "git", "url": "file:///srv/private.git"}),
    ],
)
def test_a_recipe_path_outside_the_policy_is_refused_naming_file_and_field(
    allowed: tuple[Path, list[str]], field: str, settings: dict[str, str]
) -> None:
    root, _ = allowed
    path = _recipe(root, **settings)
    with pytest.raises(PolicyRefused) as info:
        load_recipe(str(path))
    assert f"recipe {path}: {field}" in info.value.message


def test_a_remote_git_url_is_no_path(allowed: tuple[Path, list[str]]) -> None:
    root, asked = allowed
    for url in ("https://example.org/llama.cpp", "git@example.org:org/llama.cpp.git"):
        path = _recipe(root, kind="git", url=url)
        assert load_recipe(str(path)).source.url == url  # type: ignore[union-attr]
    assert not [what for what in asked if what.endswith("source.url")]


@pytest.mark.parametrize(
    ("kind", "url", "needle"),
    [
        ("git", "--upload-pack=touch /tmp/owned", "start with '-'"),
        ("git", "-oProxyCommand=sh", "start with '-'"),
        ("git", "ext::sh -c touch% /tmp/owned", "spaces"),
        ("git", "ext::sh", "transport"),
        ("git", "fd::3", "transport"),
        ("git", "ftp://example.org/x.git", "scheme"),
        ("git", "user@-oProxyCommand=x:repo", "host may not start"),
        ("archive", "ftp://example.org/x.tar.gz", "https://, http://, file://"),
        ("archive", "/tmp/x.tar.gz\\nRUN x", "control characters"),
    ],
)
def test_a_source_url_that_could_be_an_option_or_a_command_is_refused(
    tmp_path: Path, kind: str, url: str, needle: str
) -> None:
    path = _recipe(tmp_path, kind=kind, url=url)
    with pytest.raises(RecipeError) as info:
        load_recipe(str(path))
    assert "source.url" in info.value.message and needle in info.value.message


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('targets = ["--help"]\n', "not starting with '-'"),
        ('targets = ["-Dx=y"]\n', "not starting with '-'"),
        ('targets = ["llama-server", ".hidden"]\n', "not starting with '-' or '.'"),
    ],
)
def test_a_target_that_would_read_as_an_option_is_refused(tmp_path: Path, text: str, needle: str) -> None:
    path = _write(tmp_path / "r.toml", text + _source("archive", "/tmp/x.tar.gz"))
    with pytest.raises(RecipeError) as info:
        load_recipe(str(path))
    assert "targets" in info.value.message and needle in info.value.message


@pytest.mark.parametrize(
    ("package", "version"),
    [("--index-url=http://evil.example/simple/x", "1.0"), ("llama-cpp-python", "1 -r x")],
)
def test_a_pypi_name_or_version_that_is_no_plain_word_is_refused(
    tmp_path: Path, package: str, version: str
) -> None:
    text = (
        f'[source]\nkind = "pypi-sdist"\npackage = "{package}"\nversion = "{version}"\nsha256 = "{SHA}"\n'
        f'subdir = "x"\ncommit = "{COMMIT}"\nbuild_number = 1\n'
    )
    with pytest.raises(RecipeError) as info:
        load_recipe(str(_write(tmp_path / "r.toml", text)))
    assert "is not a PyPI" in info.value.message


def test_a_clone_never_takes_its_url_as_an_option(tmp_path: Path, lf_home: Path) -> None:
    owned = tmp_path / "owned"
    source = GitSource.model_construct(
        kind="git", url=f"--upload-pack=touch {owned}", commit=COMMIT, build_number=1, date=None
    )
    with pytest.raises(SourceError) as info:
        fetch_source(source)
    assert "start with '-'" in info.value.message
    assert not owned.exists()


# Downloads


class _Redirect(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(302)
        self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def redirecting() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Redirect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_source_download_and_its_redirects_pass_the_url_policy(redirecting: str, lf_home: Path) -> None:
    def archive(url: str) -> ArchiveSource:
        return ArchiveSource(kind="archive", url=url, sha256=SHA, commit=COMMIT, build_number=1)

    with pytest.raises(PolicyRefused) as info:
        fetch_source(archive(f"{redirecting}/src.tar.gz"))
    assert "169.254.169.254" in info.value.message and "redirect" in info.value.message
    with pytest.raises(PolicyRefused):
        fetch_source(archive("http://169.254.169.254/src.tar.gz"))
    guard.install(HostGuard(url_hosts=frozenset({"mirror.example"})))
    try:
        with pytest.raises(PolicyRefused) as listed:
            fetch_source(archive(f"{redirecting}/src.tar.gz"))
        assert "not on this server's list of URL hosts" in listed.value.message
    finally:
        guard.install(HostGuard())
    assert not list((lf_home / "downloads").glob("*.archive"))


# Manifests, inventories, matrices


def _manifest(root: Path, **options: str) -> dict[str, object]:
    source = {
        "kind": "archive",
        "url": str(root / "src.tar.gz"),
        "sha256": SHA,
        "commit": COMMIT,
        "build_number": 1,
    }
    return {"recipe": {"name": "r", "patches": None, "source": source}, "options": options}


def test_manifest_paths_pass_the_policy(allowed: tuple[Path, list[str]]) -> None:
    root, _ = allowed
    (root / "ca.crt").write_text("x")
    recipe_from_manifest(_manifest(root, ca_bundle=str(root / "ca.crt")), origin="manifest m.json")
    cases = {
        "options.ca_bundle": _manifest(root, ca_bundle="/etc/ssl/private/key.pem"),
        "options.patches": _manifest(root, patches="/etc"),
    }
    outside = _manifest(root)
    outside["recipe"]["source"]["url"] = "file:///etc/passwd"  # type: ignore[index]
    cases["recipe: source.url"] = outside
    for field, manifest in cases.items():
        with pytest.raises(PolicyRefused) as info:
            recipe_from_manifest(manifest, origin="manifest m.json")
        assert f"manifest m.json: {field}" in info.value.message


def test_inventory_key_file_and_known_hosts_pass_the_policy(allowed: tuple[Path, list[str]]) -> None:
    root, asked = allowed
    host = '[[hosts]]\nname = "a"\naddress = "127.0.0.1"\n'
    fine = _write(root / "fleet.toml", f'key_file = "keys/id"\nknown_hosts = "fleet.known"\n{host}')
    (chosen,) = inventory_hosts(str(fine))
    assert chosen.ssh.key_file == root / "keys" / "id" and chosen.ssh.known_hosts == root / "fleet.known"
    assert asked == [f"host inventory {fine}: known_hosts", f"host inventory {fine}: key_file"]
    cases = {
        "known_hosts": 'known_hosts = "../outside.known"\n' + host,
        "key_file": 'key_file = "~/.ssh/id_ed25519"\n' + host,
        "hosts[a].key_file": host + 'key_file = "/etc/ssh/ssh_host_ed25519_key"\n',
    }
    for field, text in cases.items():
        path = _write(root / "bad.toml", text)
        with pytest.raises(PolicyRefused) as info:
            inventory_hosts(str(path))
        assert f"host inventory {path}: {field}" in info.value.message
    # Paths given as arguments replace the inventory's: they were checked as arguments.
    path = _write(root / "bad.toml", cases["hosts[a].key_file"])
    (given,) = inventory_hosts(str(path), key_file=root / "k")
    assert given.ssh.key_file == root / "k"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('[[hosts]]\nname = "a"\naddress = "-oProxyCommand=touch x"\n', "hosts.0.address"),
        ('[[hosts]]\nname = "a"\naddress = "h"\nuser = "-oProxyCommand=x"\n', "hosts.0.user"),
        ('user = "root\\nx"\n[[hosts]]\nname = "a"\naddress = "h"\n', "user"),
    ],
)
def test_an_inventory_address_or_user_that_could_be_an_option_is_refused(
    tmp_path: Path, text: str, field: str
) -> None:
    path = _write(tmp_path / "fleet.toml", text)
    with pytest.raises(RecipeError) as info:
        inventory_hosts(str(path))
    assert f"{field}: " in info.value.message


def test_matrix_paths_pass_the_policy(allowed: tuple[Path, list[str]]) -> None:
    root, _ = allowed
    cases = {
        "recipe": 'recipe = "/etc/r.toml"\n[[builds]]\nname = "x"\n',
        "builds[x].patches": '[[builds]]\nname = "x"\npatches = "/etc"\n',
        "builds[x].ssh_key": '[[builds]]\nname = "x"\nexecutor = "ssh"\nbuild_host = "h"\nssh_key = "/root/k"\n',
        "builds[x].recipe": '[[builds]]\nname = "x"\nrecipe = "../../r.toml"\n',
    }
    for field, text in cases.items():
        path = _write(root / "m.toml", text)
        with pytest.raises(PolicyRefused) as info:
            load_matrix(str(path))
        assert f"build matrix {path}: {field}" in info.value.message
    load_matrix(str(_write(root / "m.toml", '[[builds]]\nname = "x"\npatches = "llama.cpp"\n')))


# Series files


@pytest.mark.parametrize("entry", ["/etc/passwd", "../outside.patch", "sub/x.patch", "a\\b.patch", ".."])
def test_a_series_entry_is_a_plain_file_name(tmp_path: Path, entry: str) -> None:
    series = tmp_path / "series"
    _write(series / "series", f"# comment\n0001-ok.patch\n{entry}\n")
    _write(series / "0001-ok.patch", "x")
    with pytest.raises(PatchError) as info:
        read_series(series)
    assert f"{series / 'series'}:3:" in info.value.message and "plain file name" in info.value.message


def test_a_series_entry_may_not_link_out_of_its_directory(tmp_path: Path) -> None:
    series = tmp_path / "series"
    _write(series / "series", "0001-x.patch\n")
    (series / "0001-x.patch").symlink_to(_write(tmp_path / "secret", "x"))
    with pytest.raises(PatchError) as info:
        read_series(series)
    assert "outside the series directory" in info.value.message


# git: hooks, fsmonitor, ignored files, workspaces


FILE = "".join(f"int f{n}(void) {{ return {n}; }}\n" for n in range(1, 21))


def _tree(root: Path) -> Path:
    _write(root / "src" / "file.c", FILE)
    _write(root / ".gitignore", "*.env\n")
    return root


def _hostile(repo: Path, marker: Path) -> None:
    """Make ``repo``'s git run commands: an fsmonitor and every hook that commit, add and checkout run."""
    subprocess.run(
        ["git", "config", "core.fsmonitor", f"touch {marker}.fsmonitor; false"], cwd=repo, check=True
    )
    for hook in ("pre-commit", "commit-msg", "post-commit", "post-checkout", "pre-auto-gc"):
        _write(repo / ".git" / "hooks" / hook, f"#!/bin/sh\ntouch {marker}.{hook}\n").chmod(0o755)


def test_git_with_llamaforge_settings_runs_no_hook_and_no_fsmonitor(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    _write(repo / "f", "x")
    identity = ["-c", "user.name=t", "-c", "user.email=t@t"]
    for plain in (False, True):
        marker = tmp_path / ("plain" if plain else "safe")
        _hostile(repo, marker)
        for args in (["add", "-A"], ["status"], ["commit", "-qm", "m", "--allow-empty"]):
            command = ["git", *identity, *args] if plain else git_command(*identity, *args)
            LOCAL.run(command, cwd=repo, warn=True)
        ran = sorted(path.name for path in tmp_path.glob(f"{marker.name}.*"))
        if plain:  # the same repository does run them without the settings: the check above can fail
            assert "plain.fsmonitor" in ran and "plain.pre-commit" in ran
        else:
            assert ran == []


def test_new_patch_refuses_a_directory_llamaforge_did_not_make(tmp_path: Path, lf_home: Path) -> None:
    series = tmp_path / "series"
    series.mkdir()
    repo = _tree(tmp_path / "repo")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    _hostile(repo, tmp_path / "ran")
    for attempt in (lambda: new_patch(series, repo, "x"), lambda: continue_refresh(series, repo)):
        with pytest.raises(LlamaforgeError) as info:
            attempt()
        assert "not a patch workspace made by llamaforge" in info.value.message
    assert not list(tmp_path.glob("ran.*")) and not (series / "series").exists()


def test_a_workspace_whose_git_configuration_changed_is_refused(tmp_path: Path, lf_home: Path) -> None:
    series = tmp_path / "series"
    series.mkdir()
    workspace = create_workspace(_tree(tmp_path / "tree"), [], "edit")
    _hostile(workspace, tmp_path / "ran")
    _write(workspace / "src" / "file.c", FILE.replace("return 3;", "return 300;"))
    with pytest.raises(LlamaforgeError) as info:
        new_patch(series, workspace, "three")
    assert "git configuration" in info.value.message and "changed" in info.value.message
    assert not list(tmp_path.glob("ran.*"))


def test_a_new_patch_runs_no_hook_or_fsmonitor_and_leaves_ignored_files_out(
    tmp_path: Path, lf_home: Path
) -> None:
    series = tmp_path / "series"
    series.mkdir()
    tree = _tree(tmp_path / "tree")
    _write(tree / "old.env", "TOKEN=from-the-source\n")
    workspace = create_workspace(tree, [], "edit")
    # Even a workspace whose configuration was made hostile and marked again runs none of it.
    _hostile(workspace, tmp_path / "ran")
    _mark_workspace(workspace)
    _write(workspace / "src" / "file.c", FILE.replace("return 3;", "return 300;"))
    _write(workspace / "secret.env", "HF_TOKEN=hf_not_for_a_patch\n")
    path = new_patch(series, workspace, "three")
    text = path.read_text()
    assert "return 300;" in text
    assert "secret.env" not in text and "hf_not_for_a_patch" not in text and "old.env" not in text
    assert not list(tmp_path.glob("ran.*"))
    assert (series / "series").read_text() == "0001-three.patch\n"


def test_refresh_writes_only_inside_the_series_directory(tmp_path: Path, lf_home: Path) -> None:
    outside = _write(tmp_path / "outside.patch", "kept as it is\n")
    series = tmp_path / "series"
    _write(series / "series", "0001-x.patch\n")
    (series / "0001-x.patch").symlink_to(outside)
    tree = _tree(tmp_path / "tree")
    with pytest.raises(PatchError):
        refresh_series(series, tree, tree)
    assert outside.read_text() == "kept as it is\n"


# images.bootstrap


@pytest.mark.parametrize(
    ("suite", "mirror", "needle"),
    [
        ("bookworm --foreign", "http://deb.debian.org/debian", "suite"),
        ("--print-debs", "http://deb.debian.org/debian", "suite"),
        ("bookworm", "http://deb.debian.org/debian --include=curl", "mirror"),
        ("bookworm", "file:///etc", "mirror"),
        ("bookworm", "http://169.254.169.254/debian", "link-local"),
        ("bookworm", "", "mirror ''"),  # no mirror named is not "this machine's mirror"
    ],
)
def test_bootstrap_checks_suite_and_mirror_before_debootstrap(suite: str, mirror: str, needle: str) -> None:
    with pytest.raises((InvalidOption, PolicyRefused)) as info:
        bootstrap_image("llamaforge/test:x", suite=suite, mirror=mirror)
    assert needle in info.value.message
    check_bootstrap_inputs("llamaforge/debian:bookworm", "bookworm", "http://127.0.0.1:3142/debian")
