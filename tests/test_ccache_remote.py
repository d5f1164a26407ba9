"""The remote compiler cache (ccache remote storage, here one Redis server made from Debian's redis-server on the
local base image): unit tests of the URL, the password file and the stats; then real builds of the mini project
on this engine, the second one with an empty local ccache volume, which hits the entries the first one wrote to
Redis. The password is set on the server (``requirepass``) and must never show in a log, a manifest or a result.
An unreachable server and a wrong password warn and build; a bad URL or a missing password file stop before
anything is built."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import invoke, mini_recipe
from llamaforge.build.ccache import CacheStats, RemoteCache, probe_verdict
from llamaforge.core.errors import InvalidOption

pytestmark = pytest.mark.quick

PASSWORD = "s3cr:et@pw/x#1"  # every character ccache's URL parser would trip on


def _password_file(tmp_path: Path, text: str = PASSWORD + "\n") -> Path:
    path = tmp_path / "redis-password"
    path.write_text(text, encoding="utf-8")
    path.chmod(0o600)
    return path


# --- the URL and the password file (no Docker) ---------------------------------------------------------------


def test_the_password_goes_into_ccaches_url_encoded_and_nowhere_else(tmp_path: Path) -> None:
    cache = RemoteCache.parse("redis://cache.example:6379", _password_file(tmp_path))
    # ccache decodes the user part before it splits USER:PASSWORD, so a password with ':' gets Redis's user.
    assert cache.storage_url() == "redis://default:s3cr%3Aet%40pw%2Fx%231@cache.example:6379"
    assert cache.config_text() == f"remote_storage = {cache.storage_url()}\n"
    assert (cache.host, cache.port) == ("cache.example", 6379)
    assert PASSWORD in cache.secrets() and cache.storage_url() in cache.secrets()
    plain = RemoteCache.parse("redis://alice@h:1/2|read-only=true", _password_file(tmp_path, "pw\n"))
    assert plain.storage_url() == "redis://alice:pw@h:1/2|read-only=true"
    assert RemoteCache.parse("redis://h").storage_url() == "redis://h"
    assert RemoteCache.parse("http://h/cache").port == 80


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("redis://hunter22@h:6379", "holds a password"),
        ("redis://u:hunter22@h:6379", "holds a password"),
        ("rediss://h:6379", "scheme 'rediss'"),
        ("h:6379", "is not one ccache"),
        ("redis://h:99999", "port is not a number"),
        ("redis://h:port", "port is not a number"),
        ("redis://:6379", "names no host"),
        ("redis://h:6379/cache", "ends with the host"),
        ("redis://h:6379|read only", "holds spaces"),
        ("redis://h:6379|nonsense", "not a ccache storage attribute"),
        ("", "empty"),
    ],
)
def test_a_bad_url_is_refused_without_showing_a_password(url: str, words: str) -> None:
    with pytest.raises(InvalidOption) as info:
        RemoteCache.parse(url)
    assert words in info.value.message and "hunter22" not in info.value.render()
    assert "--ccache-remote" in info.value.message


def test_a_cloud_metadata_address_is_refused_as_any_url_is() -> None:
    from llamaforge.core.guard import PolicyRefused

    with pytest.raises(PolicyRefused, match="link-local or cloud-metadata"):
        RemoteCache.parse("redis://169.254.169.254:6379")


def test_a_password_file_that_cannot_serve_is_refused_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(InvalidOption, match=f"password file {missing} does not exist"):
        RemoteCache.parse("redis://h", missing)
    with pytest.raises(InvalidOption, match="is empty"):
        RemoteCache.parse("redis://h", _password_file(tmp_path, "\n"))
    with pytest.raises(InvalidOption, match="not one line"):
        RemoteCache.parse("redis://h", _password_file(tmp_path, "a\nb\n"))
    with pytest.raises(InvalidOption, match="needs a user name"):
        RemoteCache.parse("http://h/cache", _password_file(tmp_path))


def test_stats_and_the_probes_verdict_come_from_ccaches_stats_log() -> None:
    log = [
        "# /src/a.c",
        "direct_cache_hit",
        "local_storage_miss",
        "remote_storage_hit",
        "remote_storage_read_hit",
        "# /src/b.c",
        "cache_miss",
        "direct_cache_miss",
        "preprocessed_cache_miss",
        "remote_storage_miss",
        "remote_storage_write",
    ]
    stats = CacheStats.from_log(log)
    assert (stats.calls, stats.hits, stats.remote_hits, stats.misses, stats.remote_writes) == (2, 1, 1, 1, 1)
    assert stats.to_json()["remote_hit_rate"] == 0.5
    assert "1 of 2 compilations were hits (0 local, 1 from the remote storage)" in stats.summary()
    cache = RemoteCache.parse("redis://127.0.0.1:7")
    assert probe_verdict(cache, ["llamaforge-probe: connected", "cache_miss", "remote_storage_miss"]) is None
    down = probe_verdict(cache, ["llamaforge-probe: no connection", "cache_miss", "remote_storage_error"])
    assert down and "nothing answers at 127.0.0.1:7" in down and "local cache only" in down
    refused = probe_verdict(cache, ["llamaforge-probe: connected", "remote_storage_error"])
    assert refused and "wrong password" in refused


def test_cli_refuses_the_remote_cache_where_it_cannot_apply(tmp_path: Path, lf_home: Path) -> None:
    recipe = mini_recipe(tmp_path, ["llama-cli"])
    env = {**os.environ, "LLAMAFORGE_HOME": str(lf_home)}
    cases = [
        (["--executor", "local", "--ccache-remote", "redis://127.0.0.1:1"], "are for --executor docker"),
        (["--ccache-password-file", str(_password_file(tmp_path))], "add --ccache-remote"),
        (["--ccache-remote", "redis://hunter22@127.0.0.1:1"], "holds a password"),
        (
            ["--ccache-remote", "redis://127.0.0.1:1", "--ccache-password-file", str(tmp_path / "gone")],
            "gone",
        ),
    ]
    for extra, words in cases:
        result = invoke("build", "--recipe", str(recipe), "--dry-run", *extra, env=env)
        assert result.returncode == 2, result.stderr
        assert words in result.stderr and "Traceback" not in result.stderr and "hunter22" not in result.stderr
    assert not (lf_home / "builds").exists()


# --- real builds with one Redis server --------------------------------------------------------------------------

PREFIX = f"lfcc-{uuid.uuid4().hex[:8]}"
REDIS_IMAGE = "llamaforge-test/redis:bookworm"


def _docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def redis_image(base_image: str, context: Path) -> str:
    """Debian's redis-server on the local base image (made once; no registry)."""
    if _docker("image", "inspect", REDIS_IMAGE, check=False).returncode != 0:
        context.mkdir(parents=True, exist_ok=True)
        (context / "Dockerfile").write_text(
            f"FROM {base_image}\n"
            "RUN apt-get update && apt-get install -y --no-install-recommends redis-server "
            "&& rm -rf /var/lib/apt/lists/*\n",
            encoding="utf-8",
        )
        _docker("build", "-q", "-t", REDIS_IMAGE, str(context))
    return REDIS_IMAGE


@pytest.fixture(scope="module")
def redis(docker_engine: object, base_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis server published on 127.0.0.1 with a password (``requirepass`` read from a file mounted in, so
    the password is on no command line); yields its URL (no password)."""
    secrets = tmp_path_factory.mktemp("redis")
    (secrets / "redis.conf").write_text(f'requirepass "{PASSWORD}"\n', encoding="utf-8")
    port, name = _free_port(), f"{PREFIX}-redis"
    _docker(
        "run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:6379",
        "-v", f"{secrets}:/etc/lf-redis:ro", redis_image(base_image, secrets / "image"),
        "redis-server", "/etc/lf-redis/redis.conf", "--bind", "0.0.0.0", "--protected-mode", "no",
        "--save", "", "--appendonly", "no",
    )  # fmt: skip
    try:
        for _ in range(50):
            if "Ready to accept connections" in _docker("logs", name).stdout:
                break
            subprocess.run(["sleep", "0.2"], check=True)
        yield f"redis://127.0.0.1:{port}"
    finally:
        _docker("rm", "-f", name, check=False)


def redis_keys(client: Any, name: str = f"{PREFIX}-redis") -> int:
    """How many entries the server holds (the password goes in the exec's environment, on no command line)."""
    result = client.containers.get(name).exec_run(
        ["redis-cli", "--no-auth-warning", "dbsize"], environment={"REDISCLI_AUTH": PASSWORD}
    )
    return int(result.output.decode().strip())


def _build(recipe: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    return invoke(
        "build", "--recipe", str(recipe), "--cmake", "LLAMA_MINI_CCACHE=ON", "--json", *extra, env=env
    )


def _manifest(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert result.returncode == 0, result.stderr[-3000:]
    path = Path(json.loads(result.stdout)["build"]["path"]) / "manifest.json"
    data: dict[str, object] = json.loads(path.read_text())
    return data


@pytest.mark.docker
def test_an_empty_local_cache_hits_what_another_build_left_in_redis(
    redis: str, docker_engine: Any, tmp_path: Path, lf_home: Path
) -> None:
    recipe = mini_recipe(tmp_path, ["llama-cli", "llama-random"])
    secret = _password_file(tmp_path)
    volumes = [f"{PREFIX}-a", f"{PREFIX}-b"]
    env = {**os.environ, "LLAMAFORGE_HOME": str(lf_home)}
    cache = ["--ccache-remote", redis, "--ccache-password-file", str(secret)]
    try:
        first = _manifest(_build(recipe, {**env, "LLAMAFORGE_CCACHE_VOLUME": volumes[0]}, *cache))
        assert redis_keys(docker_engine) > 0, "the first build wrote its objects to Redis"
        second_run = _build(recipe, {**env, "LLAMAFORGE_CCACHE_VOLUME": volumes[1]}, *cache, "--force")
        second = _manifest(second_run)
    finally:
        _docker("volume", "rm", "-f", *volumes, check=False)
    assert first["key"] == second["key"], "the remote cache is no input of the build key"
    ccache = second["ccache"]
    assert isinstance(ccache, dict) and ccache["remote_storage"] == redis
    # llama-cli's object comes from Redis; llama-random embeds fresh random bytes, so it must miss.
    assert (ccache["calls"], ccache["remote_hits"], ccache["local_hits"], ccache["misses"]) == (2, 1, 0, 1)
    assert ccache["remote_errors"] == 0
    assert "1 from the remote storage" in second_run.stderr
    leaked = [
        path for path in lf_home.rglob("*") if path.is_file() and PASSWORD.encode() in path.read_bytes()
    ]
    assert not leaked and PASSWORD not in second_run.stderr + second_run.stdout
    assert "s3cr%3Aet" not in second_run.stderr + json.dumps(second)


@pytest.mark.docker
def test_a_cache_that_cannot_be_used_warns_and_the_build_goes_on(
    redis: str, tmp_path: Path, lf_home: Path
) -> None:
    recipe = mini_recipe(tmp_path, ["llama-cli"])
    env = {**os.environ, "LLAMAFORGE_HOME": str(lf_home)}
    closed = f"redis://127.0.0.1:{_free_port()}"
    volumes = [f"{PREFIX}-c", f"{PREFIX}-d"]  # empty local caches: every lookup goes on to the remote one
    try:
        down = _build(recipe, {**env, "LLAMAFORGE_CCACHE_VOLUME": volumes[0]}, "--ccache-remote", closed)
        wrong = _build(
            recipe, {**env, "LLAMAFORGE_CCACHE_VOLUME": volumes[1]}, "--ccache-remote", redis,
            "--ccache-password-file", str(_password_file(tmp_path, "not-it\n")), "--force",
        )  # fmt: skip
    finally:
        _docker("volume", "rm", "-f", *volumes, check=False)
    assert "nothing answers at 127.0.0.1" in down.stderr and "local cache only" in down.stderr
    assert _manifest(down)["ccache"]["remote_errors"] >= 1  # type: ignore[index]
    assert "answers but refused ccache (a wrong password" in wrong.stderr
    assert _manifest(wrong)["ccache"]["remote_errors"] >= 1  # type: ignore[index]
