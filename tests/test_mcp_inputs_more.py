"""More of what a caller may send the MCP front, through the real SDK client: tool names it does not have, path
parameters no file system holds, booleans for numbers inside lists, and an operation that crashes."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import mcp_types
import pytest
from pydantic import Field

from helpers import REPO, error_text

if str(REPO) not in sys.path:  # `mcp_server/` sits at the top of the checkout, next to tasks.py
    sys.path.insert(0, str(REPO))

from mcp import Client
from mcp_server import ServerOptions, build_server

from llamaforge.core.registry import OperationContext, Params, Result, operation, operations

pytestmark = [pytest.mark.quick, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class CountsParams(Params):
    """Parameters of the test-only operations."""

    counts: list[int] = Field(default_factory=lambda: [1], description="Numbers")
    name: str = Field("x", description="A name")


class Counted(Result):
    """What the test-only operation was given."""

    counts: list[int]


@pytest.fixture
def calls() -> Iterator[list[list[int]]]:
    seen: list[list[int]] = []

    @operation("testonly.count", CountsParams, read_only=True)
    def count(params: CountsParams, ctx: OperationContext) -> Counted:
        """Record the numbers it was given (test only)."""
        seen.append(params.counts)
        return Counted(counts=params.counts)

    @operation("testonly.crash", CountsParams, read_only=True)
    def crash(params: CountsParams, ctx: OperationContext) -> Counted:
        """Fail with an error no check foresaw (test only)."""
        raise OSError(36, "File name too long", params.name)

    try:
        yield seen
    finally:
        for name in ("testonly.count", "testonly.crash"):
            operations().pop(name, None)


async def test_an_unknown_tool_is_named_with_the_closest_one(lf_home: Path) -> None:
    async with Client(build_server()) as client:
        dotted = error_text(await client.call_tool("models.fit", {"model": "tiny", "ctx": 512}))
        cased = error_text(await client.call_tool("Recipes_List", {}))
        nothing = error_text(await client.call_tool("xyzzy", {}))
    assert dotted == "no tool 'models.fit' on this server\n  hint: did you mean 'models_fit'?"
    assert cased == "no tool 'Recipes_List' on this server\n  hint: did you mean 'recipes_list'?"
    assert nothing == "no tool 'xyzzy' on this server\n  hint: tools/list shows the tools this server has"


async def test_a_tool_read_only_hides_says_so(lf_home: Path) -> None:
    async with Client(build_server(ServerOptions(read_only=True))) as client:
        for name in ("build", "build_start", "models.fetch"):
            text = error_text(await client.call_tool(name, {}))
            assert text.startswith(
                f"no tool {name!r} on this server: it changes state, and this server was started with --read-only"
            ), text
            assert "hint: run it from the command line" in text


async def test_a_path_longer_than_the_file_system_holds_is_refused_naming_the_parameter(
    lf_home: Path,
) -> None:
    async with Client(build_server()) as client:
        name = error_text(await client.call_tool("recipes_show", {"name": "a" * 500}))
        nested = error_text(await client.call_tool("build", {"recipe": "a/" * 3000, "dry_run": True}))
    assert name.endswith(
        "path parameter 'name' is refused: at 500 characters it is longer than this file system allows for a "
        "path or for one name in it; give the path of an existing file, or a shipped name"
    ), name
    assert "path parameter 'recipe' is refused: at 6000 characters" in nested
    assert "OSError" not in name + nested and "internal error" not in name + nested


async def test_an_operation_that_crashes_says_so_instead_of_a_bare_error(
    calls: list[list[int]], lf_home: Path
) -> None:
    async with Client(build_server()) as client:
        text = error_text(await client.call_tool("testonly_crash", {"name": "spot"}))
    # The SDK alone answered "Error executing tool testonly_crash" and nothing else.
    assert text.endswith(
        "internal error in testonly.crash: OSError: [Errno 36] File name too long: 'spot'\n"
        "  hint: this is a bug in llamaforge; the server's log has the traceback"
    ), text


async def test_booleans_inside_a_list_of_numbers_are_refused(calls: list[list[int]], lf_home: Path) -> None:
    async with Client(build_server()) as client:
        listed = error_text(await client.call_tool("testonly_count", {"counts": [True, 2]}))
        text = error_text(await client.call_tool("testonly_count", {"name": True}))
        counted = await client.call_tool("testonly_count", {"counts": [3, 2]})
    assert listed == "invalid arguments for testonly_count: counts[0]: true is not a number"
    # a string field keeps pydantic's own words: true is no string, not "no number"
    assert text == "invalid arguments for testonly_count: name: Input should be a valid string"
    assert counted.structured_content == {"counts": [3, 2]}
    assert calls == [[3, 2]], "a list with a boolean in it ran nothing"


async def test_an_unknown_recipe_resource_names_the_closest_one(lf_home: Path) -> None:
    from mcp import MCPError

    async with Client(build_server()) as client:
        with pytest.raises(MCPError) as cased:
            await client.read_resource("llamaforge://recipes/DEFAULT")
        with pytest.raises(MCPError) as unknown:
            await client.read_resource("llamaforge://recipes/zzz")
    assert cased.value.error.message == (
        "no shipped recipe 'DEFAULT'; did you mean llamaforge://recipes/default? llamaforge://recipes lists them"
    )
    assert cased.value.error.code == mcp_types.INVALID_PARAMS
    assert unknown.value.error.message == "no shipped recipe 'zzz'; llamaforge://recipes lists them"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--http", "--port", "-1"], "--port -1 is no TCP port: give one from 1 to 65535"),
        (["--http", "--port", "99999"], "--port 99999 is no TCP port: give one from 1 to 65535"),
        (
            ["--http", "--path", "mcp"],
            "--path 'mcp' is no URL path: give one that starts with '/', e.g. /mcp",
        ),
        (["--http", "--host", "not a host"], "--host 'not a host' is no address to bind"),
        (["--http", "--host", "[]"], "--host '' is no address to bind"),
        (
            ["--project-dir", "/nonexistent-llamaforge"],
            "--project-dir /nonexistent-llamaforge does not exist",
        ),
        (["--project-dir", "/etc/hostname"], "--project-dir /etc/hostname is no directory"),
    ],
)
def test_server_flags_that_cannot_work_are_refused_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, --port/--host/--path ended in a pydantic or starlette traceback; --project-dir served a
    # directory that is not there.
    from llamaforge.fronts.mcp.main import parse_args

    with pytest.raises(SystemExit) as stopped:
        parse_args(argv)
    assert stopped.value.code == 2
    assert f"python -m mcp_server: error: {message}" in capsys.readouterr().err


def test_a_bracketed_ipv6_host_is_bound_bare() -> None:
    from llamaforge.fronts.mcp.auth import auth_settings
    from llamaforge.fronts.mcp.main import parse_args

    args = parse_args(["--http", "--host", "[::1]"])
    assert args.host == "::1"
    assert str(auth_settings(args.host, args.port).issuer_url) == "http://[::1]:8765"
