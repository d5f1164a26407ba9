"""A build matrix fanned out over a builder fleet of real Docker engines: this machine's engine and the session's
two extra engines (tcp + TLS on 127.0.0.1, tests/engines.py). The entries build the mini project, so each build
takes seconds; ``llama-nap`` makes one take as long as a test needs to act while it runs. The engines share two
cores, so no speed-up is shown: placement, overlap in time, the image sent by id, a builder stopped mid-build,
cancellation on every engine, and the errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engines import ExtraEngine, free_port, make_certificates
from helpers import invoke, mini_recipe

pytestmark = pytest.mark.docker

LOCAL = "unix:///var/run/docker.sock"


def _fleet(path: Path, engines: list[ExtraEngine], extra: str = "") -> Path:
    e1, e2 = engines
    path.write_text(
        f"""description = "test fleet"
[[builders]]
name = "local"
engine = "{LOCAL}"
platforms = ["linux"]
labels = ["here"]

[[builders]]
name = "e1"
engine = "{e1.url}"
tls_verify = true
cert_path = "{e1.client}"
platforms = ["linux"]
labels = ["fast"]

[[builders]]
name = "e2"
engine = "{e2.url}"
tls_verify = true
cert_path = "{e2.client}"
platforms = ["linux", "windows"]
concurrency = 2
{extra}""",
        encoding="utf-8",
    )
    return path


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key} = {_toml(item)}" for key, item in value.items()) + "}"
    return json.dumps(value)


def _matrix(path: Path, recipe: Path, entries: list[dict[str, Any]]) -> Path:
    lines = [f'recipe = "{recipe}"']
    for entry in entries:
        lines += ["[[builds]]", *(f"{key} = {_toml(value)}" for key, value in entry.items())]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


class Recorder:
    """A reporter that keeps (time, message) of every event, and lets a test wait for one."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str]] = []
        self._seen = threading.Condition()

    def __call__(self, event: Any) -> None:
        with self._seen:
            self.events.append((time.monotonic(), event.message))
            self._seen.notify_all()

    def wait_for(self, *parts: str, timeout: float = 120) -> None:
        with self._seen:
            assert self._seen.wait_for(
                lambda: any(all(part in message for part in parts) for _, message in self.events), timeout
            ), f"no event with {parts}: " + "\n".join(message for _, message in self.events[-30:])

    def build_span(self, prefix: str) -> tuple[float, float]:
        """When the entry ``prefix`` names began fetching its source and when it published its build."""
        start = [when for when, text in self.events if text.startswith(prefix) and "fetching source" in text]
        end = [when for when, text in self.events if text.startswith(prefix) and "published build" in text]
        return min(start), max(end)


def _run(matrix: Path, fleet: str, recorder: Recorder, cancel: Any = None) -> Any:
    from llamaforge.build.ops import BuildParams, build_op
    from llamaforge.core.events import CancelToken
    from llamaforge.core.registry import OperationContext

    ctx = OperationContext(reporter=recorder, cancel=cancel or CancelToken())
    return build_op(BuildParams(matrix=str(matrix), builders=fleet), ctx)


def _owned(engine_env: dict[str, str] | None) -> set[str]:
    env = engine_env or {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}
    listed = subprocess.run(
        ["docker", "ps", "-aq", "--no-trunc", "--filter", "label=org.llamaforge.owned"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return set(listed.stdout.split())


@pytest.fixture
def farm(extra_engines: list[ExtraEngine], base_image: str, tmp_path: Path, lf_home: Path) -> Iterator[Path]:
    """A fleet file over this machine's engine and the two extra engines (each started, whatever a test did)."""
    for engine in extra_engines:
        if not engine.running:
            engine.start()
    yield _fleet(tmp_path / "lab.toml", extra_engines)
    for engine in extra_engines:
        if not engine.running:
            engine.start()


def test_entries_are_placed_by_labels_and_slots_run_at_once_and_name_their_builder(
    farm: Path, extra_engines: list[ExtraEngine], tmp_path: Path
) -> None:
    from llamaforge.build.store import load_manifest
    from llamaforge.runners.engine import image_id

    nap = mini_recipe(tmp_path, ["llama-nap"], name="nap")
    matrix = _matrix(
        tmp_path / "m.toml",
        nap,
        [
            {"name": "fast", "labels": ["fast"], "cmake": {"LLAMA_MINI_NAP": "8", "LLAMA_X": "fast"}},
            {"name": "here", "labels": ["here"], "cmake": {"LLAMA_MINI_NAP": "1", "LLAMA_X": "here"}},
            {"name": "any1", "cmake": {"LLAMA_MINI_NAP": "8", "LLAMA_X": "any1"}},
            {"name": "any2", "cmake": {"LLAMA_MINI_NAP": "8", "LLAMA_X": "any2"}},
        ],
    )
    recorder = Recorder()
    result = _run(matrix, str(farm), recorder)
    rows = {row.name: row for row in result.matrix}
    assert {row.result for row in rows.values()} == {"built"}, rows
    assert rows["fast"].builder == f"e1 ({extra_engines[0].url})"
    assert rows["here"].builder == f"local ({LOCAL})"
    e2 = f"e2 ({extra_engines[1].url})"
    assert rows["any1"].builder == rows["any2"].builder == e2, "the builder with free slots (two)"
    # Each build runs from fetching its source to publishing it (after its engine has the image).
    fast, any1, any2 = (recorder.build_span(prefix) for prefix in ("fast@e1:", "any1@e2:", "any2@e2:"))
    assert any1[0] < any2[1] and any2[0] < any1[1], "two builds at once on one engine"
    assert fast[0] < any1[1] and any1[0] < fast[1], "builds at once on two engines"
    messages = [message for _, message in recorder.events]
    tag = next(
        found.group(1) for text in messages if (found := re.search(r"sending the builder image (\S+)", text))
    )
    for name, engine in (("e1", extra_engines[0]), ("e2", extra_engines[1])):
        assert any(f"from this machine to {name}" in message for message in messages), messages
        assert engine.has_image(tag)
    local_id = image_id(tag)
    keys = set()
    for row in rows.values():
        manifest = load_manifest(str(row.key))
        assert manifest is not None and manifest["image"]["builder_id"] == local_id, (
            "the same image everywhere"
        )
        assert manifest["builder"]["name"] == row.builder.split()[0]
        assert str(extra_engines[0].client) not in json.dumps(manifest), "no TLS key path in a manifest"
        keys.add(row.key)
    assert len(keys) == 4
    # The image is sent once: a second run finds it on every engine (and every build in the store).
    again = Recorder()
    second = _run(matrix, str(farm), again)
    assert {row.result for row in second.matrix} == {"cache hit"}
    assert not any("sending the builder image" in message for _, message in again.events)


def test_a_builder_stopped_mid_build_has_its_entry_retried_on_another(
    farm: Path, extra_engines: list[ExtraEngine], tmp_path: Path
) -> None:
    nap = mini_recipe(tmp_path, ["llama-nap"], name="nap")
    matrix = _matrix(
        tmp_path / "m.toml", nap, [{"name": "slow", "cmake": {"LLAMA_MINI_NAP": "8", "LLAMA_X": "lost"}}]
    )
    recorder = Recorder()
    outcome: dict[str, Any] = {}
    worker = threading.Thread(
        target=lambda: outcome.update(result=_run(matrix, f"{farm}:e2,local", recorder)), daemon=True
    )
    worker.start()
    recorder.wait_for("slow@e2:", "copying source")
    time.sleep(2)  # the script runs now
    extra_engines[1].stop()
    worker.join(timeout=150)
    assert not worker.is_alive()
    row = outcome["result"].matrix[0]
    assert row.result == "built" and row.builder == f"local ({LOCAL})", row
    assert row.lost_builders == ["e2"]
    messages = [message for _, message in recorder.events]
    assert any("slow@e2: builder lost" in message for message in messages), messages
    assert any("retrying on another builder (local)" in message for message in messages)


def test_cancelling_removes_the_running_containers_on_every_engine(
    farm: Path, extra_engines: list[ExtraEngine], tmp_path: Path
) -> None:
    from llamaforge.core.errors import OperationFailed
    from llamaforge.core.events import CancelToken

    nap = mini_recipe(tmp_path, ["llama-nap"], name="nap")
    matrix = _matrix(
        tmp_path / "m.toml",
        nap,
        [
            {"name": "a", "labels": ["fast"], "cmake": {"LLAMA_MINI_NAP": "60", "LLAMA_X": "cancel-a"}},
            {"name": "b", "labels": ["here"], "cmake": {"LLAMA_MINI_NAP": "60", "LLAMA_X": "cancel-b"}},
        ],
    )
    before = _owned(None)
    recorder = Recorder()
    cancel = CancelToken()
    caught: dict[str, BaseException] = {}

    def run() -> None:
        try:
            _run(matrix, f"{farm}:e1,local", recorder, cancel)
        except BaseException as error:  # noqa: BLE001 - the test reads it
            caught["error"] = error

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    recorder.wait_for("a@e1:", "copying source")
    recorder.wait_for("b@local:", "copying source")
    time.sleep(2)
    assert _owned(extra_engines[0].env), "a container runs on e1"
    started = time.monotonic()
    cancel.cancel()
    worker.join(timeout=60)
    assert not worker.is_alive() and time.monotonic() - started < 45
    error = caught["error"]
    assert isinstance(error, OperationFailed) and error.exit_code == 130
    assert {row.result for row in error.result.matrix} == {"not run"}  # type: ignore[attr-defined]
    assert _owned(extra_engines[0].env) == set(), "e1's container was removed"
    assert _owned(None) - before == set(), "this machine's container was removed"


def test_unreachable_tls_failure_and_no_platform_are_clear(
    farm: Path, extra_engines: list[ExtraEngine], tmp_path: Path, lf_home: Path
) -> None:
    other_ca = make_certificates(tmp_path / "other-ca", ("client",))["client"]
    fleet = _fleet(
        tmp_path / "bad.toml",
        extra_engines,
        extra=f"""
[[builders]]
name = "dead"
engine = "tcp://127.0.0.1:{free_port()}"
platforms = ["linux"]
labels = ["dead"]

[[builders]]
name = "badtls"
engine = "{extra_engines[0].url}"
tls_verify = true
cert_path = "{other_ca}"
platforms = ["linux"]
""",
    )
    env = {**os.environ, "LLAMAFORGE_HOME": str(lf_home)}
    status = invoke("builders.status", "--builders", str(fleet), "--json", env=env)
    assert status.returncode == 0, status.stderr
    states = {state["name"]: state for state in json.loads(status.stdout)["builders"]}
    assert [name for name, state in states.items() if state["reachable"]] == ["local", "e1", "e2"]
    assert states["e2"]["version"].startswith("Docker ") and states["e2"]["cores"] >= 1
    assert states["e2"]["memory_gib"] > 0 and states["local"]["free_disk_gib"] > 0
    assert "cannot reach the Docker engine" in states["dead"]["error"]
    assert "machine is up" in states["dead"]["hint"]
    assert "TLS failure" in states["badtls"]["hint"], states["badtls"]
    table = invoke("builders.status", "--builders", f"{fleet}:dead,local", env=env)
    assert table.returncode == 0 and "unreachable" in table.stdout and "Traceback" not in table.stderr

    recipe = mini_recipe(tmp_path, ["llama-cli"])
    only_dead = _matrix(tmp_path / "d.toml", recipe, [{"name": "x", "labels": ["dead"]}])
    failed = invoke("build", "--matrix", str(only_dead), "--builders", str(fleet), env=env)
    assert failed.returncode == 5, failed.stderr
    assert "no builder left that can build it" in failed.stdout + failed.stderr
    assert "Traceback" not in failed.stderr

    mac = _matrix(tmp_path / "mac.toml", recipe, [{"name": "metal", "platform": "macos"}])
    refused = invoke("build", "--matrix", str(mac), "--builders", f"{fleet}:local,e2", env=env)
    assert refused.returncode == 2, refused.stderr
    assert "no builder of local, e2 can build the entry 'metal' (platform macos)" in refused.stderr
    assert "local builds linux, not macos" in refused.stderr and "Traceback" not in refused.stderr


def test_builders_status_asks_an_ssh_build_host_and_refuses_an_unknown_host_key(
    test_hosts: list[Any], tmp_path: Path, lf_home: Path
) -> None:
    from llamaforge.build.farm.ops import BuildersStatusParams, builders_status_op
    from llamaforge.core.registry import OperationContext

    host = test_hosts[0]
    known = tmp_path / "known_hosts"
    known.write_text("\n".join(host.host_key_lines()) + "\n", encoding="utf-8")
    fleet = tmp_path / "hosts.toml"
    fleet.write_text(
        "".join(
            f"""
[[builders]]
name = "{name}"
build_host = "{host.ssh_host().user}@127.0.0.1:{host.port}"
ssh_key = "{host.key_file}"
{f'known_hosts = "{known}"' if name == "known" else ""}
platforms = ["linux"]
memory_gib = 3
"""
            for name in ("known", "stranger")
        ),
        encoding="utf-8",
    )
    result = builders_status_op(BuildersStatusParams(builders=str(fleet)), OperationContext())
    known_state, stranger = result.builders
    assert known_state.reachable and known_state.version == "SSH build host", known_state
    assert known_state.system and known_state.system.startswith("Linux x86_64")
    assert known_state.cores and known_state.cores_probed and known_state.free_disk_gib
    assert known_state.memory_gib == 3 and not known_state.memory_probed, "the fleet's figure wins"
    assert not stranger.reachable and stranger.error and "ssh-keyscan" in (stranger.hint or ""), stranger
