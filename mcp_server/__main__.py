"""``python -m mcp_server``: stdio by default; ``--http`` for streamable HTTP (loopback, bearer token required)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from types import FrameType

from llamaforge.core.errors import LlamaforgeError
from llamaforge.core.jobs import JobManager
from mcp_server.auth import StaticTokenVerifier, auth_settings, is_loopback, load_token, transport_security
from mcp_server.server import ServerOptions, build_server


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m mcp_server", description=__doc__)
    parser.add_argument("--http", action="store_true", help="Serve streamable HTTP instead of stdio")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="HTTP port (default: 8765)")
    parser.add_argument("--path", default="/mcp", help="HTTP endpoint path (default: /mcp)")
    parser.add_argument(
        "--token-file", type=Path, help="File holding the bearer token (default: $LLAMAFORGE_MCP_TOKEN)"
    )
    parser.add_argument(
        "--allowed-host", action="append", default=[], metavar="NAME",
        help="Extra Host header name clients use (e.g. behind a reverse proxy); repeatable",
    )  # fmt: skip
    parser.add_argument("--read-only", action="store_true", help="Expose only read-only tools")
    parser.add_argument(
        "--allow-root", action="append", type=Path, default=[], metavar="DIR",
        help="Another directory path parameters may point into (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--project-dir",
        type=Path,
        default=Path.cwd(),
        help="The project directory (default: the current one)",
    )
    parser.add_argument(
        "--confirm", choices=["param", "elicit"], default="param",
        help="Destructive tools run with confirm=true or an accepted elicitation (param, default), "
        "or only with an accepted elicitation (elicit)",
    )  # fmt: skip
    return parser.parse_args(argv)


def _stop_on_signal(jobs: JobManager) -> None:
    """SIGTERM/SIGINT: cancel running jobs (their containers are removed), then exit at once.

    Exiting directly is deliberate: the stdio transport blocks in a thread reading stdin, which no
    cancellation reaches, so an orderly shutdown could wait forever for a client that sends nothing.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        running = jobs.running()
        if running:
            print(f"signal {signum}: cancelling {len(running)} running job(s)", file=sys.stderr, flush=True)
            jobs.shutdown(cancel=True, timeout=60)
        sys.stderr.flush()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def main(argv: list[str] | None = None) -> int:
    """Run the server until the client (stdio) or a signal (HTTP) ends it; returns the exit code."""
    args = parse_args(argv)
    options = ServerOptions(
        read_only=args.read_only,
        project_dir=args.project_dir.resolve(),
        allow_roots=tuple(args.allow_root),
        confirm=args.confirm,
    )
    jobs = JobManager()
    try:
        if args.http:
            token = load_token(args.token_file)
            server = build_server(
                options,
                jobs=jobs,
                token_verifier=StaticTokenVerifier(token),
                auth=auth_settings(args.host, args.port),
            )
        else:
            server = build_server(options, jobs=jobs)
    except LlamaforgeError as error:
        print(f"error: {error.render()}", file=sys.stderr)
        return error.exit_code
    if args.http and not is_loopback(args.host):
        print(f"warning: serving on {args.host}, reachable from other machines", file=sys.stderr)
    _stop_on_signal(jobs)
    try:
        if args.http:
            server.run(
                "streamable-http", host=args.host, port=args.port, streamable_http_path=args.path,
                transport_security=transport_security(args.host, args.port, args.allowed_host),
            )  # fmt: skip
        else:
            server.run("stdio")
    finally:
        # The client went away (stdio) or the HTTP server stopped: jobs outlive the connection and finish;
        # a signal while waiting cancels them.
        running = jobs.running()
        if running:
            print(
                f"waiting for {len(running)} running job(s); Ctrl-C cancels them", file=sys.stderr, flush=True
            )
            jobs.shutdown(cancel=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
