"""llamaforge's MCP server: every registered operation as a tool, plus jobs, resources and prompts.

It is also importable and runnable as the top-level ``mcp_server`` (a thin alias kept for existing clients).

Run it from the project directory (the checkout, next to ``tasks.py``)::

    python -m mcp_server                       # stdio (what desktop clients and Jupyter AI launch)
    python -m mcp_server --read-only           # only read-only tools, which write nothing and run no program
    LLAMAFORGE_MCP_TOKEN=... python -m mcp_server --http --port 8765    # streamable HTTP on 127.0.0.1

A client's server entry (``mcp_settings.json``, ``claude_desktop_config.json``)::

    {"mcpServers": {"llamaforge": {"command": "python", "args": ["-m", "mcp_server"],
                                   "cwd": "/path/to/llamaforge"}}}
"""

from llamaforge.fronts.mcp.options import ServerOptions
from llamaforge.fronts.mcp.server import build_server, start_tool_name, tool_name

__all__ = ["ServerOptions", "build_server", "start_tool_name", "tool_name"]
