"""``stack.proxy`` on the host: the one helper every fetching command goes through.

A fetch (apt, curl, pip, conda, git) runs as ``PREFIX COMMAND``, where PREFIX puts the proxy
variables (``http_proxy``, ``https_proxy``, ``no_proxy`` and their upper-case twins) into the
environment of the shell that runs COMMAND:

- a proxy without a password: ``export http_proxy='...' ...;`` inline (nothing secret);
- a proxy with credentials: ``. /etc/p40fleet/proxy.env;``: the values are in that root-owned
  0600 file (:func:`file_text`, written by ``operations.proxy.credentials`` in the preflight),
  so the password is never on a command line (``ps``), in pyinfra's output or in a log.

Commands run as the training user (``su`` in ``operations.util.as_user.as_user``) are wrapped
outside the ``su``: root reads the file, ``su`` (not a login shell) keeps the environment.
Commands dropped with ``env -i`` (:mod:`p40fleet.privdrop`) get the variables passed explicitly.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Iterator
from typing import Any

from pyinfra.api import StringCommand

from p40fleet.privdrop import PROXY_VARIABLES
from p40fleet.spec.proxy import Proxy

__all__ = [
    "PROXY_DIR",
    "PROXY_FILE",
    "MISSING",
    "UNCHECKED",
    "VARIABLES",
    "file_text",
    "proxied",
    "proxied_all",
    "shell_prefix",
]

PROXY_DIR = "/etc/p40fleet"
#: root:root 0600; ``export NAME='value'`` lines, sourced by the fetching commands.
PROXY_FILE = f"{PROXY_DIR}/proxy.env"
#: The variables the fetching tools read (curl/git: lower case; pip/conda: either; apt: lower).
VARIABLES = PROXY_VARIABLES


def _exports(proxy: Proxy) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in proxy.variables().items())


def file_text(proxy: Proxy) -> str:
    """The content of :data:`PROXY_FILE` for ``proxy`` (holds the credentials)."""
    return "# p40fleet: stack.proxy, for the fetching steps (root:root 0600)\n" + _exports(proxy)


#: What a command does when the credentials file is not there: says so and fails.
MISSING = (
    f'echo "stack.proxy: {PROXY_FILE} (the proxy credentials) is missing on $(hostname); '
    'fix: run deploy/preflight.py (it writes the file), then re-run" >&2; exit 1'
)


def shell_prefix(proxy: Proxy | None, missing: str = MISSING) -> str:
    """Shell text that puts ``proxy``'s variables into the environment ("" for no proxy).
    Never holds a password: with credentials it sources :data:`PROXY_FILE`, running
    ``missing`` (default: fail with the fix) when the file is not there."""
    if proxy is None:
        return ""
    if not proxy.has_secret:
        return _exports(proxy).replace("\n", "; ")
    return f"if [ -r {PROXY_FILE} ]; then . {PROXY_FILE}; else {missing}; fi; "


#: :class:`facts.mirror.UrlHead` before the preflight wrote the credentials (a first run): the
#: mirror check is left to the download step, which fails naming the URL if it does not answer.
UNCHECKED = "echo 'status=-1 error=not checked: the proxy credentials reach the host later'; exit 0"


def proxied(command: StringCommand | str, proxy: Proxy | None) -> StringCommand | str:
    """``command`` run with ``proxy``'s variables (unchanged without a proxy)."""
    prefix = shell_prefix(proxy)
    if not prefix:
        return command
    # A subshell: the variables (and an exit for a missing file) stay in this command.
    return StringCommand("(", prefix.rstrip(), command, ")")


def proxied_all(commands: Iterable[Any], proxy: Proxy | None) -> Iterator[Any]:
    """Every shell command of an operation's ``commands`` (``StringCommand`` or the plain
    string pyinfra's own operations yield, e.g. ``apt.packages._inner``) through
    :func:`proxied`; uploads and functions unchanged."""
    for command in commands:
        yield proxied(command, proxy) if isinstance(command, (StringCommand, str)) else command
