"""How llamaforge runs git: every invocation goes through :func:`git_command`, so no repository it touches (a
cloned source, a patch workspace, a copied tree that carries a ``.git``) can make git run a program of its
choosing, and a source URL reaches only the transports a source may use.

* ``core.hooksPath=/dev/null``: no hook runs (``pre-commit``, ``post-checkout`` …);
* ``core.fsmonitor=false``: no file-system monitor command runs on ``status``, ``add`` or ``diff``;
* ``protocol.allow=never`` with https, http, ssh, git and file allowed: no ``ext::`` command transport, no
  ``fd::``, no remote helper;
* no terminal prompt for credentials, and commits never signed (no ``gpg.program``).

Configured filters, merge drivers and diff programs are out of reach because llamaforge only runs git in
repositories whose configuration it wrote (a clone it made, or a workspace whose configuration is checked, see
:mod:`llamaforge.build.patchflow`) and its diffs pass ``--no-ext-diff --no-textconv``.
"""

from __future__ import annotations

SAFE_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "commit.gpgsign=false",
    "protocol.allow=never",
    "protocol.https.allow=always",
    "protocol.http.allow=always",
    "protocol.ssh.allow=always",
    "protocol.git.allow=always",
    "protocol.file.allow=always",
)
"""``-c`` settings of every git command llamaforge runs (they override every configuration file)."""

SAFE_ENV = {"GIT_TERMINAL_PROMPT": "0"}
"""Environment of every git command: a repository that wants credentials fails instead of waiting for them."""


def git_command(*args: str) -> list[str]:
    """``git`` with :data:`SAFE_CONFIG` before ``args``."""
    settings = [item for setting in SAFE_CONFIG for item in ("-c", setting)]
    return ["git", *settings, *args]
