"""Test tiers: every test file names its tier, every test gets exactly one, and `--tier` selects by it.

A file states its default tier in its module-level ``pytestmark`` (``quick`` for the unit tests); a test that
needs more carries a heavier marker of its own, which wins. The tiers, lightest first:

- ``quick``: no Docker and no build (the sdist's vocabulary files are read); `nox -s quick`, the inner loop;
- ``llamacpp``: the llama.cpp source or a real llama.cpp build (made in Docker unless prebuilt builds are given);
- ``docker``: a Docker engine (containers, test hosts, Swarm, builds);
- ``cuda_toolkit``: nvcc and cuobjdump from the CUDA wheels;
- ``slow``: over a minute on purpose (an MCP call longer than a client's request timeout).

Collection fails for a file that names no tier, and for a quick test whose fixtures need Docker or a build: the
quick tier must run, and pass, on a machine with neither."""

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


@pytest.hookimpl(trylast=True)
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
    if not wanted:
        return
    keep = [item for item in items if tier_of(item) in wanted]
    dropped = [item for item in items if tier_of(item) not in wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
