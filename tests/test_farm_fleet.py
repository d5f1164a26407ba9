"""Builder fleets checked without an engine: the file's model, its errors and how each builder is reached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llamaforge.build.executors.base import Executor
from llamaforge.build.executors.docker import DockerExecutor
from llamaforge.build.executors.ssh import SshBuildExecutor
from llamaforge.build.farm import load_fleet
from llamaforge.build.farm.builders import Builder, fleet_json_schema
from llamaforge.build.farm.fanout import FleetRun
from llamaforge.build.farm.placement import Need, choose, eligible, refusal
from llamaforge.build.matrix import Matrix, MatrixEntry, load_matrix
from llamaforge.core.errors import InvalidOption, RecipeError
from llamaforge.core.events import Event
from llamaforge.core.paths import data_dir
from llamaforge.core.registry import OperationContext
from llamaforge.runners.ssh import SshError

pytestmark = pytest.mark.quick

SCHEMA = data_dir("recipes") / "schema" / "builder-fleet.schema.json"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_checked_in_fleet_schema_matches_the_model() -> None:
    # Regenerate:
    # python -c "from llamaforge.build.farm.builders import fleet_json_schema as s; print(s(), end='')"
    assert SCHEMA.read_text(encoding="utf-8") == fleet_json_schema()


def test_the_example_fleet_loads_and_names_its_builders() -> None:
    fleet = load_fleet("example")
    local = fleet.builder("local")
    assert local.platforms == ["linux", "windows"] and local.concurrency == 1
    assert local.label() == "local (unix:///var/run/docker.sock)"
    executor = local.executor()
    assert isinstance(executor, DockerExecutor)
    assert executor.engine.url == "unix:///var/run/docker.sock" and executor.engine.tls_verify is False
    with pytest.raises(InvalidOption) as unknown:
        fleet.builder("locl")
    assert "did you mean 'local'" in (unknown.value.hint or "") and "example.toml" in unknown.value.message


FLEET = """
description = "lab"
[ccache]
remote_storage = "redis://127.0.0.1:6379"
password_file = "secret/redis"

[[builders]]
name = "big"
engine = "tcp://127.0.0.1:2376"
tls_verify = true
cert_path = "certs/big"
platforms = ["linux", "windows"]
cores = 32
labels = ["cuda", "fast"]
concurrency = 2

[[builders]]
name = "mac"
build_host = "builder@127.0.0.1:2222"
ssh_key = "keys/id"
known_hosts = "known_hosts"
platforms = ["macos"]
"""


def test_a_fleet_resolves_paths_next_to_its_file_and_reaches_each_builder(tmp_path: Path) -> None:
    (tmp_path / "certs" / "big").mkdir(parents=True)
    for name in ("ca.pem", "cert.pem", "key.pem"):  # the engine's TLS files are checked where it is reached
        write(tmp_path / "certs" / "big" / name, "x")
    (tmp_path / "keys").mkdir()
    write(tmp_path / "keys" / "id", "x")  # and the build host's key
    fleet = load_fleet(write(tmp_path / "lab.toml", FLEET))
    assert fleet.name == "lab" and fleet.origin.endswith("lab.toml")
    big, mac = fleet.builders
    engine = big.engine_config()
    assert engine.url == "tcp://127.0.0.1:2376" and engine.tls_verify is True
    assert engine.cert_path == tmp_path / "certs" / "big"
    assert big.labels == ["cuda", "fast"] and big.concurrency == 2 and big.memory_gib is None
    host = mac.ssh_host()
    assert (host.host, host.port, host.user) == ("127.0.0.1", 2222, "builder")
    assert host.key_file == tmp_path / "keys" / "id" and host.known_hosts == tmp_path / "known_hosts"
    assert isinstance(mac.executor(), SshBuildExecutor) and mac.label() == "mac (builder@127.0.0.1:2222)"
    assert fleet.ccache is not None and fleet.ccache.password_file == str(tmp_path / "secret" / "redis")
    assert [builder.name for builder in fleet.select("mac, big")] == ["big", "mac"]  # the fleet's order
    assert [builder.name for builder in fleet.select(None)] == ["big", "mac"]


@pytest.mark.parametrize(
    ("text", "message", "hint"),
    [
        ('[[builders]]\nname = "a"\nengin = "unix:///x"\nplatforms = ["linux"]\n', "builders.0.engin: unknown key",
         "did you mean 'engine'"),
        ('descripton = "x"\n[[builders]]\nname = "a"\nengine = "unix:///x"\nplatforms = ["linux"]\n',
         "descripton: unknown key", "did you mean 'description'"),
        ('[[builders]]\nname = "a"\nplatforms = ["linux"]\n', "exactly one of engine", None),
        ('[[builders]]\nname = "a"\nengine = "unix:///x"\nbuild_host = "u@h:22"\nplatforms = ["linux"]\n',
         "exactly one of engine", None),
        ('[[builders]]\nname = "a"\nengine = "http://h:2375"\nplatforms = ["linux"]\n', "not a Docker engine URL",
         None),
        ('[[builders]]\nname = "a"\nengine = "unix:///x"\nplatforms = ["linx"]\n', "builders.0.platforms.0", None),
        ('[[builders]]\nname = "a"\nengine = "tcp://127.0.0.1:99999"\nplatforms = ["linux"]\n',
         "names no host and valid port", None),
        ('[[builders]]\nname = "a"\nengine = "tcp://"\nplatforms = ["linux"]\n', "names no host", None),
        ('[[builders]]\nname = "a"\nbuild_host = "u@127.0.0.1:abc"\nplatforms = ["linux"]\n',
         "has no valid port", None),
        ('[[builders]]\nname = "a"\nbuild_host = "u@h;id"\nplatforms = ["linux"]\n',
         "is not a DNS name or an IP address", None),
        ('[[builders]]\nname = "a"\nengine = "tcp://h:2376"\ntls_verify = true\nplatforms = ["linux"]\n',
         "tls_verify needs cert_path", None),
        ('[[builders]]\nname = "a"\nengine = "unix:///x"\nplatforms = ["linux"]\nconcurrency = 0\n',
         "builders.0.concurrency", None),
        ('[[builders]]\nname = "a"\nengine = "unix:///x"\nplatforms = ["linux"]\n'
         '[[builders]]\nname = "a"\nengine = "unix:///y"\nplatforms = ["linux"]\n', "given twice: a", None),
        ('[ccache]\nremote_storage = "redis://:hunter2@127.0.0.1:6379"\n'
         '[[builders]]\nname = "a"\nengine = "unix:///x"\nplatforms = ["linux"]\n', "holds a password", None),
        ('[ccache]\nremote_storage = "redis://hunter2@127.0.0.1:6379"\n'
         '[[builders]]\nname = "a"\nengine = "unix:///x"\nplatforms = ["linux"]\n', "holds a password", None),
        ('[ccache]\nremote_storage = "ftp://h/x"\n'
         '[[builders]]\nname = "a"\nengine = "unix:///x"\nplatforms = ["linux"]\n', "scheme 'ftp' is not one",
         None),
    ],
)  # fmt: skip
def test_a_bad_fleet_names_the_file_and_field(
    tmp_path: Path, text: str, message: str, hint: str | None
) -> None:
    path = write(tmp_path / "bad.toml", text)
    with pytest.raises(RecipeError) as caught:
        load_fleet(path)
    assert str(path) in caught.value.message and message in caught.value.message
    assert "hunter2" not in caught.value.message
    if hint:
        assert hint in (caught.value.hint or "")


def test_an_unknown_fleet_name_gets_did_you_mean() -> None:
    with pytest.raises(RecipeError) as caught:
        load_fleet("exampel")
    assert "did you mean 'example'" in (caught.value.hint or "")


def _builders(tmp_path: Path) -> list[Builder]:
    return load_fleet(write(tmp_path / "lab.toml", FLEET + PLACEMENT)).builders


PLACEMENT = """
[[builders]]
name = "small"
engine = "unix:///var/run/docker.sock"
platforms = ["linux"]
cores = 2

[[builders]]
name = "win"
build_host = "builder@127.0.0.1:2223"
platforms = ["windows"]
"""


def test_placement_follows_platform_toolchain_labels_and_free_slots(tmp_path: Path) -> None:
    big, mac, small, win = _builders(tmp_path)
    linux = Need("cpu", "linux")
    assert choose(linux, [big, mac, small, win], {}).name == "big"  # two free slots beat one
    assert choose(linux, [big, mac, small, win], {"big": 1}).name == "big"  # one each: more cores
    assert choose(linux, [big, mac, small, win], {"big": 2}).name == "small"  # big is full
    assert choose(linux, [big, mac, small, win], {"big": 2, "small": 1}) is None  # all busy: wait
    assert choose(linux, [big, mac, small, win], {}, excluded={"big"}).name == "small"  # lost or tried
    assert choose(Need("cuda", "linux", ("cuda",)), [small, big], {}).name == "big"
    assert choose(Need("metal", "macos"), [big, mac, small, win], {}).name == "mac"
    assert choose(Need("w", "windows", toolchain="msvc"), [big, mac, small, win], {}).name == "win"
    assert choose(Need("w", "windows", toolchain="mingw"), [big, mac, small, win], {}).name == "big"
    assert eligible(Need("w", "windows"), [big, mac, small, win]) == [big, win]
    refused = refusal(Need("fast", "linux", ("fast", "gpu")), [small, mac])
    assert refused == "small lacks the label(s) fast, gpu; mac builds macos, not linux"


HOSTS = """
[[builders]]
name = "a"
build_host = "u@127.0.0.1:2201"
platforms = ["linux"]
concurrency = 2

[[builders]]
name = "b"
build_host = "u@127.0.0.1:2202"
platforms = ["linux"]
"""


def _hosts_matrix(tmp_path: Path, count: int) -> Matrix:
    entries = "".join(f'[[builds]]\nname = "e{index}"\nplatform = "linux"\n' for index in range(count))
    return load_matrix(str(write(tmp_path / "m.toml", entries)))


def test_a_lost_build_host_is_left_out_and_its_entry_retried_once(tmp_path: Path) -> None:
    """The scheduling alone, with build hosts (which nothing pings) and a stand-in build: ``a`` drops every
    connection, so its entries go to ``b``; with ``b`` lost as well, an entry fails after its one retry."""
    fleet = load_fleet(write(tmp_path / "hosts.toml", HOSTS))
    calls: list[tuple[str, str]] = []
    lost = {"a"}

    def build_one(
        entry: MatrixEntry, executor: Executor, builder: Builder, ctx: OperationContext
    ) -> dict[str, Any]:
        calls.append((entry.name, builder.name))
        ctx.reporter(Event("stage", "building"))
        if builder.name in lost:
            raise SshError(f"connection to {builder.name} lost", hint="check the host")
        return {"result": "built", "key": f"k-{entry.name}"}

    events: list[str] = []
    ctx = OperationContext(reporter=lambda event: events.append(event.message))
    rows = FleetRun(_hosts_matrix(tmp_path, 3), fleet.builders, build_one, ctx).run()
    assert [(row.name, row.result, row.builder, row.lost_builders) for row in rows] == [
        (f"e{index}", "built", "b (u@127.0.0.1:2202)", ["a"] if (f"e{index}", "a") in calls else None)
        for index in range(3)
    ]
    assert calls[:2] == [("e0", "a"), ("e1", "a")], "a has two slots, b one: a first"
    assert "e0@a: building" in events and any("builder lost: connection to a lost" in text for text in events)

    lost.add("b")
    calls.clear()
    rows = FleetRun(_hosts_matrix(tmp_path, 1), fleet.builders, build_one, ctx).run()
    assert calls == [("e0", "a"), ("e0", "b")], "tried once more, on the other builder"
    assert rows[0].result == "failed" and rows[0].lost_builders == ["a", "b"]
    assert (
        rows[0].error == "builder b was lost: connection to b lost"
        and rows[0].exit_code == SshError.exit_code
    )


def test_an_entry_no_builder_can_build_refuses_the_matrix_before_anything_runs(tmp_path: Path) -> None:
    fleet = load_fleet(write(tmp_path / "hosts.toml", HOSTS))
    matrix = load_matrix(str(write(tmp_path / "m.toml", '[[builds]]\nname = "metal"\nplatform = "macos"\n')))
    with pytest.raises(InvalidOption) as caught:
        FleetRun(matrix, fleet.builders, lambda *args: {}, OperationContext()).run()
    assert caught.value.message == (
        "no builder of a, b can build the entry 'metal' (platform macos): a builds linux, not macos; "
        "b builds linux, not macos"
    )
