"""The one privilege drop for code the training user can change (S1 of the security review).

Facts and the verify probe run as the connecting user (root, or root through sudo). Whatever
lives under the training user's home -- the env's python and its ``.pth`` files, conda, ray, the
verl checkout's ``.git/config`` -- is the training user's to change, so root never executes it:
those commands run through :data:`AS_USER_FN` as the training user, with a clean environment
(``env -i``), from ``/``. ``runuser`` rather than ``setpriv``: it is in util-linux on every
supported OS (Ubuntu 20.04's setpriv is a separate package there).
"""

from __future__ import annotations

import shlex

__all__ = ["AS_USER_FN", "CLEAN_PATH", "PROXY_VARIABLES", "as_user_script"]

#: PATH of the dropped commands: system directories only, never one under the home.
CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: The proxy variables ``stack.proxy`` sets (:mod:`p40fleet.proxy`): kept through ``env -i``.
PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
# Each only when set in the caller's environment (a fetch wrapped by p40fleet.proxy.proxied).
_KEEP = " ".join(f'${{{v}+"{v}=${v}"}}' for v in PROXY_VARIABLES)

#: ``p40fleet_as USER [VAR=value...] COMMAND [ARGS...]``: COMMAND as USER, environment cleared
#: (HOME from passwd) but for the proxy variables, working directory ``/`` (python puts the cwd
#: on sys.path). Already that user: no runuser. Any other non-root caller: runuser refuses,
#: and the answer says so.
AS_USER_FN = f"""p40fleet_as() {{
    _u=$1; shift
    _h=$(getent passwd "$_u" | cut -d: -f6)
    set -- env -i HOME="${{_h:-/}}" USER="$_u" LOGNAME="$_u" SHELL=/bin/sh PATH={CLEAN_PATH} \\
        {_KEEP} "$@"
    if [ "$(id -u)" = "$(id -u "$_u")" ]; then (cd / && "$@")
    else (cd / && PATH="$PATH:/usr/sbin:/sbin" && runuser -u "$_u" -- "$@"); fi
}}"""


def as_user_script(user: str, script: str, missing: str = "true") -> str:
    """Shell that runs ``script`` (sh) as ``user`` through :data:`AS_USER_FN`; runs
    ``missing`` instead while ``user`` does not exist (a fresh host: nothing of it to read)."""
    if not user:
        raise ValueError("no training user given: refusing to run its files as the caller")
    u = shlex.quote(user)
    return (
        f"{AS_USER_FN}\n"
        f"if id -u {u} >/dev/null 2>&1; then p40fleet_as {u} sh -c {shlex.quote(script)}; "
        f"else {missing}; fi; true"
    )
