"""``mcp_server``: the name clients launch (``python -m mcp_server``) and import; the server itself is
:mod:`llamaforge.fronts.mcp`, which documents its options and a client's server entry."""

from llamaforge.fronts.mcp import ServerOptions, build_server, start_tool_name, tool_name

__all__ = ["ServerOptions", "build_server", "start_tool_name", "tool_name"]
