"""``python -m mcp_server``: stdio by default; ``--http`` for streamable HTTP (loopback, bearer token required).

The flags decide what a caller may do beyond reading and building in Docker; docs/security.md describes each.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from types import FrameType

from llamaforge.core import guard
from llamaforge.core.errors import LlamaforgeError
from llamaforge.core.guard import is_loopback
from llamaforge.core.jobs import JobManager
from llamaforge.fronts.mcp.auth import StaticTokenVerifier, auth_settings, load_token, transport_security
from llamaforge.fronts.mcp.options import DEFAULT_MAX_JOBS, ServerOptions, host_guard
from llamaforge.fronts.mcp.policy import check_project_dir
from llamaforge.fronts.mcp.server import build_server

PARAM_WARNING = (
    "warning: --confirm param: a destructive call runs when the caller passes confirm=true, so the caller, "
    "not a person, decides; use it only with a client that shows every call to its user before sending it"
)


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
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="Extra Host header name clients use (e.g. behind a reverse proxy); repeatable",
    )
    parser.add_argument(
        "--read-only",
        action="store_true",
        help="Expose only read-only tools; nothing is written, downloaded or built and no program runs",
    )
    parser.add_argument(
        "--allow-root",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="Another directory path parameters may point into (repeatable)",
    )
    parser.add_argument(
        "--project-dir",
        type=Path,
        help="The project directory (default: the current one, refused when it is / or the home directory or "
        "a parent of it)",
    )
    parser.add_argument(
        "--confirm",
        choices=["elicit", "param"],
        default="elicit",
        help="Destructive calls run when the user accepts the server's question through the client (elicit, "
        "default), or also when the caller passes confirm=true (param: the caller decides; prints a warning)",
    )
    parser.add_argument(
        "--allow-host-builds",
        action="store_true",
        help="Let calls build outside Docker (executor local/ssh, build_host), repeat manifests (from_manifest) "
        "and use recipes, patch series and matrices from outside the project; each such call is confirmed",
    )
    parser.add_argument(
        "--allow-deploy-host",
        action="append",
        default=[],
        metavar="NAME",
        help="A host destructive calls (deploy, rollback, topology) may target; repeatable (default: any)",
    )
    parser.add_argument(
        "--allow-inventory",
        action="append",
        type=Path,
        default=[],
        metavar="FILE",
        help="An inventory or topology file destructive calls may use; repeatable (default: any)",
    )
    parser.add_argument(
        "--allow-url-host",
        action="append",
        metavar="HOST",
        help="A host downloads and remote reads may reach; repeatable (default: any host except link-local "
        "and cloud-metadata addresses, which only this flag allows)",
    )
    parser.add_argument(
        "--allow-ssh-host",
        action="append",
        metavar="HOST",
        help="A host SSH may dial (deploy, status, build hosts); repeatable (default: any)",
    )
    parser.add_argument(
        "--max-jobs",
        type=int,
        default=DEFAULT_MAX_JOBS,
        metavar="N",
        help=f"Jobs that may run at once; more are refused (default: {DEFAULT_MAX_JOBS})",
    )
    args = parser.parse_args(argv)
    if args.max_jobs < 1:
        parser.error("--max-jobs must be at least 1")
    if not 1 <= args.port <= 65535:
        parser.error(f"--port {args.port} is no TCP port: give one from 1 to 65535")
    if not args.path.startswith("/") or any(char.isspace() for char in args.path):
        parser.error(f"--path {args.path!r} is no URL path: give one that starts with '/', e.g. /mcp")
    if args.host.startswith("[") and args.host.endswith("]"):
        args.host = args.host[1:-1]  # an IPv6 address as a URL writes it; the socket takes it bare
    if not args.host or any(char.isspace() or char in "/?#@" for char in args.host):
        parser.error(
            f"--host {args.host!r} is no address to bind: give an IP address or a host name, e.g. 127.0.0.1"
        )
    if args.project_dir is not None and not args.project_dir.is_dir():
        what = "does not exist" if not args.project_dir.exists() else "is no directory"
        parser.error(
            f"--project-dir {args.project_dir} {what}: give the llamaforge checkout the server works in"
        )
    return args


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
    jobs = JobManager()
    try:
        project_dir = args.project_dir or Path.cwd()
        check_project_dir(project_dir, explicit=args.project_dir is not None)
        token = load_token(args.token_file) if args.http else None
        options = ServerOptions(
            read_only=args.read_only,
            project_dir=project_dir.resolve(),
            allow_roots=tuple(args.allow_root),
            confirm=args.confirm,
            allow_host_builds=args.allow_host_builds,
            deploy_hosts=tuple(args.allow_deploy_host),
            inventories=tuple(args.allow_inventory),
            url_hosts=None if args.allow_url_host is None else tuple(args.allow_url_host),
            ssh_hosts=None if args.allow_ssh_host is None else tuple(args.allow_ssh_host),
            max_jobs=args.max_jobs,
            secrets=(token,) if token else (),
        )
        # For good, not only while a client is connected: jobs outlive their client.
        guard.install(host_guard(options))
        verifier = StaticTokenVerifier(token) if token else None
        auth = auth_settings(args.host, args.port) if token else None
        server = build_server(options, jobs=jobs, token_verifier=verifier, auth=auth)
    except LlamaforgeError as error:
        print(f"error: {error.render()}", file=sys.stderr)
        return error.exit_code
    if args.confirm == "param":
        print(PARAM_WARNING, file=sys.stderr)
    if args.http and not is_loopback(args.host):
        print(f"warning: serving on {args.host}, reachable from other machines", file=sys.stderr)
    _stop_on_signal(jobs)
    try:
        if args.http:
            server.run(
                "streamable-http",
                host=args.host,
                port=args.port,
                streamable_http_path=args.path,
                transport_security=transport_security(args.host, args.port, args.allowed_host),
            )
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
