"""Test tiers: every test file names its tier, every test gets exactly one, and `--tier` selects by it.

A file states its default tier in its module-level ``pytestmark`` (``quick`` for the unit tests); a test that
needs more carries a heavier marker of its own, which wins. The tiers, lightest first:

- ``quick``: no Docker and no build (the sdist's vocabulary files are read); `nox -s quick`, the inner loop;
- ``llamacpp``: the llama.cpp source or a real llama.cpp build (made in Docker unless prebuilt builds are given);
- ``docker``: a Docker engine (containers, test hosts, Swarm, builds);
- ``cuda_toolkit``: nvcc and cuobjdump from the CUDA wheels;
- ``slow``: over a minute on purpose (an MCP call longer than a client's request timeout).

Collection fails for a file that names no tier, and for a quick test whose fixtures need Docker or a build: the
quick tier must run, and pass, on a machine with neither.

Lanes, for `pytest -n 2 --dist loadgroup` (`nox -s tests`): the heavy tests run in two serial lanes side by side,
one xdist group each, and the quick tests run on whichever worker is free (in practice after its lane). The
build lane holds the compiles (the cold default build first, mingw, the ccache-off rebuild: CPU-bound); the host
lane holds what mostly waits on test hosts, containers and llama-server (deploys, Swarm, RPC, SSH), so its waiting
overlaps the build lane's compiling. Both lanes share one build store (tests/conftest.py `build_env`), so a build
is made once and the other lane waits for it on the build's lock. Tests that count containers or own the engine's
Swarm stay in one lane each."""

from __future__ import annotations

import pytest

TIERS = ("quick", "llamacpp", "docker", "cuda_toolkit", "slow")
# The heaviest tier a test carries is its tier; quick is the default a heavier marker overrides.
_WEIGHT = {name: weight for weight, name in enumerate(TIERS)}

# Fixtures (tests/conftest.py) that need a Docker engine or a build: a quick test using one would skip without
# them, or fail in strict mode, instead of running. The sdist (`sdist_dir`, a download) is no such need.
HEAVY_FIXTURES = frozenset(
    {
        "docker_engine",
        "base_image",
        "build_env",
        "source_tree",
        "stock_build",
        "patched_build",
        "baseline_build",
        "test_hosts",
        "extra_engines",
    }
)


# Files whose heavy tests form the host lane: each boots or talks to test hosts, containers or a Swarm and mostly
# waits; every other heavy test is in the build lane.
HOST_LANE_FILES = frozenset(
    {
        "test_deploy_docker.py",
        "test_deploy_faults.py",
        "test_deploy_messages.py",
        "test_deploy_probe.py",
        "test_deploy_render.py",
        "test_deploy_root_and_args.py",
        "test_deploy_rpc.py",
        "test_deploy_ssh.py",
        "test_deploy_swarm.py",
        "test_hostile_renders.py",
        "test_platform_builds.py",
        "test_runtime_image.py",
        "test_ssh_runner.py",
        "test_unit_hardening.py",
    }
)
LANES = ("build", "hosts")


def lane_of(item: pytest.Item) -> str | None:
    """The heavy test's lane (``build`` or ``hosts``); None for a quick test, which any worker may run."""
    if tier_of(item) in (None, "quick"):
        return None
    return "hosts" if item.path.name in HOST_LANE_FILES else "build"


def tier_of(item: pytest.Item) -> str | None:
    """The test's tier: the heaviest tier marker on it or above it (function, class, module), None without one."""
    names = {marker.name for marker in item.iter_markers() if marker.name in _WEIGHT}
    return max(names, key=_WEIGHT.__getitem__) if names else None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--tier",
        action="append",
        default=[],
        choices=TIERS,
        help="run only the tests of this tier (repeatable); `nox -s quick` is `--tier quick`",
    )


def untiered_files(items: list[pytest.Item]) -> list[str]:
    """Test files (relative paths) with a test but no module-level tier marker."""
    missing: set[str] = set()
    for item in items:
        module = item.getparent(pytest.Module)
        if module is None:
            continue
        if not any(marker.name in _WEIGHT for marker in module.own_markers):
            missing.add(module.nodeid)
    return sorted(missing)


def misplaced_quick_tests(items: list[pytest.Item]) -> list[str]:
    """Quick tests that use a fixture needing Docker, the sdist or a build, each with the fixtures it names."""
    found = []
    for item in items:
        if tier_of(item) != "quick":
            continue
        heavy = sorted(HEAVY_FIXTURES.intersection(getattr(item, "fixturenames", ())))
        if heavy:
            found.append(f"{item.nodeid} (uses {', '.join(heavy)})")
    return found


# First: the lanes' xdist_group marks must be on the items before xdist's own hook reads them.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = [
        f"{path}: no tier; add `pytestmark = pytest.mark.quick` (or one of {', '.join(TIERS[1:])})"
        for path in untiered_files(items)
    ]
    problems += [
        f"{test}: in the quick tier but needs more; mark it" for test in misplaced_quick_tests(items)
    ]
    if problems:
        raise pytest.UsageError("test tiers:\n  " + "\n  ".join(problems))
    wanted = set(config.getoption("tier"))
    keep = [item for item in items if tier_of(item) in wanted]
    dropped = [item for item in items if tier_of(item) not in wanted]
    if wanted:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    # An xdist worker runs with dist "no" and the loadgroup flag set (xdist's remote.setup_config).
    if getattr(config.option, "loadgroup", False) or getattr(config.option, "dist", "no") == "loadgroup":
        _into_lanes(items)


def _into_lanes(items: list[pytest.Item]) -> None:
    """Mark each heavy test with its lane's xdist group, and order the items build lane, host lane, the rest:
    xdist hands out work units round robin in collection order, so the two lanes start on two workers."""
    lanes: dict[str | None, list[pytest.Item]] = {lane: [] for lane in (*LANES, None)}
    for item in items:
        lane = lane_of(item)
        if lane is not None:
            item.add_marker(pytest.mark.xdist_group(lane))
        lanes[lane].append(item)
    items[:] = [item for lane in lanes.values() for item in lane]
