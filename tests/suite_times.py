"""`--suite-times FILE`: where the suite's time goes, written as JSON for benchmarks/suite_time.py.

For every test: its file, tier, outcome and the setup / call / teardown durations pytest measured; for every
fixture set up: its name, scope and the time its own setup took (its dependencies are set up before it and
counted on their own), so a cold build shows up under the fixture that made it, not under whichever test
happened to ask first; and the whole run's wall time with the CPU it ran on."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tiers import tier_of

_KEY = pytest.StashKey[dict[str, Any]]()
# The test being run: a session fixture's request names the session, not the test that first asked for it.
_current = [""]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--suite-times", metavar="FILE", help="write each test's and fixture's durations as JSON"
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("suite_times"):
        config.stash[_KEY] = {"started": time.time(), "tests": {}, "fixtures": [], "tiers": {}}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    record = config.stash.get(_KEY, None)
    if record is not None:
        record["tiers"] = {item.nodeid: tier_of(item) for item in items}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    del location
    _current[0] = nodeid.removesuffix("@build").removesuffix(
        "@hosts"
    )  # xdist's loadgroup suffix (tiers.LANES)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Iterator[Any]:
    record = request.config.stash.get(_KEY, None)
    start = time.perf_counter()
    try:
        return (yield)
    finally:
        if record is not None:
            record["fixtures"].append(
                {
                    "name": fixturedef.argname,
                    "scope": fixturedef.scope,
                    "test": _current[0],
                    "seconds": round(time.perf_counter() - start, 3),
                }
            )


def _plain_id(item: pytest.Item) -> str:
    """The test's id without the ``@GROUP`` that xdist's loadgroup appends."""
    group = item.get_closest_marker("xdist_group")
    suffix = f"@{group.args[0]}" if group is not None and group.args else ""
    return item.nodeid.removesuffix(suffix) if suffix else item.nodeid


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    record = item.config.stash.get(_KEY, None)
    if record is None:
        return
    entry = record["tests"].setdefault(
        _plain_id(item), {"file": item.nodeid.split("::", 1)[0], "tier": tier_of(item), "outcome": "passed"}
    )
    entry[call.when] = round(call.duration, 3)
    entry["worker"] = os.environ.get("PYTEST_XDIST_WORKER", "")
    if call.excinfo is not None:
        skipped = call.excinfo.errisinstance(pytest.skip.Exception)
        entry["outcome"] = "skipped" if skipped else ("failed" if call.when == "call" else "error")


def pytest_sessionfinish(session: pytest.Session) -> None:
    record = session.config.stash.get(_KEY, None)
    if record is None:
        return
    from helpers import cpu_header

    cpuinfo = Path("/proc/cpuinfo")
    record["cpu"] = cpu_header(
        cpuinfo.read_text(encoding="utf-8", errors="replace") if cpuinfo.is_file() else ""
    )
    record["wall_s"] = round(time.time() - record["started"], 1)
    record["cores"] = os.cpu_count()
    path = Path(session.config.getoption("suite_times"))
    path.parent.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:  # an xdist worker: its part, merged by the controller when every worker is done
        path = path.with_name(f"{path.name}.{worker}")
    else:
        for part in sorted(path.parent.glob(f"{path.name}.gw*")):
            data = json.loads(part.read_text(encoding="utf-8"))
            record["tests"].update(data["tests"])
            record["fixtures"] += data["fixtures"]
            record["tiers"].update(data["tiers"])
            part.unlink()
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
