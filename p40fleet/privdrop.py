"""The one privilege drop for code the training user can change (S1 of the security review).

Facts and the verify probe run as the connecting user (root, or root through sudo). Whatever
lives under the training user's home -- the env's python and its ``.pth`` files, conda, ray, the
verl checkout's ``.git/config`` -- is the training user's to change, so root never executes it:
those commands run through :data:`AS_USER_FN` as the training user, with a clean environment
(``env -i``), from ``/``. ``runuser`` rather than ``setpriv``: it is in util-linux on every
supported OS (Ubuntu 20.04's setpriv is a separate package there).

Writes follow the same rule (review N1-N3): root never creates, writes, extracts, chowns or
reads anything under the home. What root must hand over it puts in :data:`STAGE_DIR` (its own,
0700, outside the home) and streams to a command run as the user (:func:`copy_in_script`),
which renames it into place: a symlink the user left there is replaced, never followed.
"""

from __future__ import annotations

import shlex

__all__ = [
    "AS_USER_FN",
    "CLEAN_PATH",
    "PROXY_VARIABLES",
    "READ_TIMEOUT_S",
    "ROOT_GUARD",
    "STAGE_DIR",
    "as_user_script",
    "copy_in_script",
]

#: PATH of the dropped commands: system directories only, never one under the home.
CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: The proxy variables ``stack.proxy`` sets (:mod:`p40fleet.proxy`): kept through ``env -i``.
PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
# Each only when set in the caller's environment (a fetch wrapped by p40fleet.proxy.proxied).
_KEEP = " ".join(f'${{{v}+"{v}=${v}"}}' for v in PROXY_VARIABLES)

#: ``p40fleet_as USER [VAR=value...] COMMAND [ARGS...]``: COMMAND as USER, environment cleared
#: (HOME from passwd) but for the proxy variables, working directory ``/`` (python puts the cwd
#: on sys.path). Already that user: no runuser. Any other non-root caller: runuser refuses,
#: and the answer says so. A USER of uid 0 is refused (the spec refuses system accounts; this
#: is the second line: the drop never runs anything as root).
AS_USER_FN = f"""p40fleet_as() {{
    _u=$1; shift
{{root_guard}}    _h=$(getent passwd "$_u" | cut -d: -f6)
    set -- env -i HOME="${{_h:-/}}" USER="$_u" LOGNAME="$_u" SHELL=/bin/sh PATH={CLEAN_PATH} \\
        {_KEEP} "$@"
    if [ "$(id -u)" = "$(id -u "$_u")" ]; then (cd / && "$@")
    else (cd / && PATH="$PATH:/usr/sbin:/sbin" && runuser -u "$_u" -- "$@"); fi
}}"""
#: The first lines of :data:`AS_USER_FN`: USER of uid 0 (root, or another name for it) is
#: refused, exit 126, nothing run (the spec refuses system accounts; this is the second line).
ROOT_GUARD = """    if [ "$(id -u "$_u" 2>/dev/null)" = 0 ]; then
        echo "p40fleet_as: $_u has uid 0: refusing to run its files as root" >&2
        return 126
    fi
"""
AS_USER_FN = AS_USER_FN.replace("{root_guard}", ROOT_GUARD)


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


#: Root's staging directory for what it uploads for the training user (root-owned, mode 0700,
#: outside the home): root writes only here, the user's command reads the file on its stdin.
STAGE_DIR = "/var/lib/p40fleet/stage"

#: Seconds a command run as the training user may read one of its files (a FIFO, a file the
#: user keeps growing): it is ended, not waited for.
READ_TIMEOUT_S = 120


def copy_in_script(dest: str, mode: str) -> str:
    """sh to run AS the training user: its stdin becomes ``dest`` (mode ``mode``), written to a
    temporary file beside ``dest`` and renamed over it. Whatever is at ``dest`` -- a file, a
    symlink -- is replaced, never followed; a directory there stops the command, naming it."""
    d = shlex.quote(dest)
    moved = shlex.quote(
        f"{dest} is a directory where p40fleet writes a file: move it away "
        f"(mv {dest} {dest}.moved) and re-run"
    )
    return (
        f"if [ -d {d} ] && [ ! -L {d} ]; then echo {moved} >&2; exit 1; fi; "
        f"t=$(mktemp {shlex.quote(dest + '.p40fleet-XXXXXX')}) || exit 1; "
        f'if cat > "$t" && chmod {shlex.quote(mode)} "$t" && mv -fT "$t" {d}; then exit 0; fi; '
        'rm -f "$t"; exit 1'
    )
