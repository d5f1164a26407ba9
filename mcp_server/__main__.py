"""``python -m mcp_server``: runs :mod:`llamaforge.fronts.mcp` (stdio by default; ``--help`` lists the options)."""

import sys

from llamaforge.fronts.mcp.main import main

if __name__ == "__main__":
    sys.exit(main())
