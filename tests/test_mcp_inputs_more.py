"""More of what a caller may send the MCP front, through the real SDK client: tool names it does not have, path
parameters no file system holds, booleans for numbers inside lists, and an operation that crashes."""

from __future__ import annotations

import sys
from pathlib import Path

import mcp_types
import pytest

from helpers import REPO

if str(REPO) not in sys.path:  # `mcp_server/` sits at the top of the checkout, next to tasks.py
    sys.path.insert(0, str(REPO))

from mcp import Client
from mcp_server import build_server

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def error_text(result: mcp_types.CallToolResult) -> str:
    assert result.is_error, result.structured_content
    block = result.content[0]
    assert isinstance(block, mcp_types.TextContent)
    return block.text


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
