"""``python -m llamaforge.fronts.mcp``: the same server as ``python -m mcp_server``."""

import sys

from llamaforge.fronts.mcp.main import main

if __name__ == "__main__":
    sys.exit(main())
