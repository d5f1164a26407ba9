"""Streamable HTTP safety: a static bearer token (TokenVerifier) and Host/Origin checks.

The token comes from ``LLAMAFORGE_MCP_TOKEN`` or a file; without one the HTTP transport refuses to start.
"""

from __future__ import annotations

import hmac
import os
import stat
from pathlib import Path

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.transport_security import TransportSecuritySettings

from llamaforge.core.errors import InvalidOption
from llamaforge.core.guard import is_loopback

TOKEN_ENV = "LLAMAFORGE_MCP_TOKEN"  # noqa: S105 - the variable that holds it, not a token
MIN_TOKEN_LENGTH = 16


class StaticTokenVerifier:
    """Accepts exactly one bearer token (compared in constant time)."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    async def verify_token(self, token: str) -> AccessToken | None:
        """The access info for the configured token; None for anything else."""
        if hmac.compare_digest(token.encode(), self._token):
            return AccessToken(token=token, client_id="llamaforge-mcp-client", scopes=[])
        return None


def load_token(token_file: Path | None) -> str:
    """The bearer token from ``--token-file`` (readable by its owner only) or ``LLAMAFORGE_MCP_TOKEN`` (removed
    from the environment once read, so no child process inherits it); refuses a missing or short one."""
    if token_file is not None:
        try:
            mode = token_file.stat().st_mode
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as error:
            raise InvalidOption(f"cannot read token file {token_file}: {error.strerror}") from None
        if mode & 0o077:
            raise InvalidOption(
                f"token file {token_file} can be read by other users (mode {stat.S_IMODE(mode):04o})",
                hint=f"chmod 600 {token_file}",
            )
    else:
        token = os.environ.pop(TOKEN_ENV, "").strip()
    if not token:
        raise InvalidOption(
            "the HTTP transport needs a bearer token",
            hint=f"set {TOKEN_ENV} or pass --token-file FILE (e.g. `python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))' > token`)",
        )
    if len(token) < MIN_TOKEN_LENGTH:
        raise InvalidOption(
            f"the bearer token is shorter than {MIN_TOKEN_LENGTH} characters", hint="use a random one"
        )
    return token


def auth_settings(host: str, port: int) -> AuthSettings:
    """Resource-server settings for a static token: no OAuth endpoints, no metadata route."""
    return AuthSettings(issuer_url=f"http://{_url_host(host)}:{port}", resource_server_url=None)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def transport_security(
    host: str, port: int, extra_hosts: list[str] | None = None
) -> TransportSecuritySettings:
    """Accept only requests whose Host names this server (and browser Origins of the same), against DNS rebinding."""
    names = {_url_host(host)}
    if is_loopback(host):
        names |= {"127.0.0.1", "localhost", "[::1]"}
    names |= set(extra_hosts or ())
    hosts = sorted(f"{name}:{port}" for name in names)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{item}" for item in hosts],
    )
