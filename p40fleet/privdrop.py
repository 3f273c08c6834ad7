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
    "ASK_LIMIT",
    "ASK_STDERR_LIMIT",
    "AS_USER_FN",
    "CLEAN_PATH",
    "ENDED",
    "FACT_TIMEOUT_S",
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

#: Seconds a command run as the training user may read one of its files (a FIFO, a file the
#: user keeps growing): it is ended, not waited for.
READ_TIMEOUT_S = 120

#: Seconds a fact's command run as the training user (its python, conda, git, ray) may take
#: before root ends it (``p40fleet_ask``): a ``.pth`` that sleeps, a FIFO it reads.
FACT_TIMEOUT_S = READ_TIMEOUT_S

#: Bytes of a user-run command's stdout that root keeps (``p40fleet_ask``): the largest answer
#: (an env's distributions, JSON) is a few dozen KB; a ``.pth`` printing 50 MB is cut here.
ASK_LIMIT = 262144

#: The line a fact's output ends with when root ended the user's command (``ENDED SECONDS``):
#: the facts that run a program say "broken" and why (a ``.pth`` that hangs, a FIFO read).
ENDED = "@@p40fleet-ended-after"

#: Bytes of its stderr kept (the last ones: a traceback's end).
ASK_STDERR_LIMIT = 4096

#: ``p40fleet_as USER [VAR=value...] COMMAND [ARGS...]``: COMMAND as USER, environment cleared
#: (HOME from passwd) but for the proxy variables, working directory ``/`` (python puts the cwd
#: on sys.path). Already that user: no runuser. Any other non-root caller: runuser refuses,
#: and the answer says so. A USER of uid 0 is refused (the spec refuses system accounts; this
#: is the second line: the drop never runs anything as root).
#:
#: ``p40fleet_ask [-m] SECONDS USER COMMAND...``: the same, bounded, for reading what the user's
#: programs say (facts, the verify probe; review S19/N6). Root's ``timeout`` (the user cannot
#: signal or stop it) ends runuser after SECONDS (KILL 5 s later); the user's stdout (stderr
#: too with ``-m``) goes to a file in root's own ``mktemp -d`` directory, never to the caller's
#: pipe, so a child the user leaves behind cannot hold the caller's output open; root then
#: prints the first :data:`ASK_LIMIT` bytes of it (and the last :data:`ASK_STDERR_LIMIT` of
#: stderr to stderr) and removes the directory. The exit status is the command's (124: ended
#: by the timeout). stdin is the caller's: give ``</dev/null`` unless it feeds the command.
AS_USER_FN = f"""p40fleet_as() {{
    _u=$1; shift
{{root_guard}}    _h=$(getent passwd "$_u" | cut -d: -f6)
    set -- env -i HOME="${{_h:-/}}" USER="$_u" LOGNAME="$_u" SHELL=/bin/sh PATH={CLEAN_PATH} \\
        {_KEEP} "$@"
    if [ "$(id -u)" = "$(id -u "$_u")" ]; then (cd / && $p40fleet_t "$@")
    else (cd / && PATH="$PATH:/usr/sbin:/sbin" && $p40fleet_t runuser -u "$_u" -- "$@"); fi
}}
p40fleet_t=
p40fleet_ask() {{
    _m=; if [ "$1" = -m ]; then _m=1; shift; fi
    _s=$1; shift
    _d=$(mktemp -d) || {{ echo "p40fleet: mktemp -d failed: nothing run as $1" >&2; return 125; }}
    p40fleet_t="timeout -k 5 $_s"
    if [ -n "$_m" ]; then p40fleet_as "$@" >"$_d/o" 2>&1
    else p40fleet_as "$@" >"$_d/o" 2>"$_d/e"; fi
    _r=$?; p40fleet_t=
    head -c {ASK_LIMIT} "$_d/o"
    if [ -s "$_d/e" ]; then tail -c {ASK_STDERR_LIMIT} "$_d/e" >&2; fi
    rm -rf "$_d"
    if [ "$_r" -eq 124 ] || [ "$_r" -eq 137 ]; then
        echo "p40fleet: a command run as $1 was ended after $_s s (timeout)" >&2
    fi
    return "$_r"
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
    """Shell that runs ``script`` (sh) as ``user`` through ``p40fleet_ask`` (:data:`AS_USER_FN`:
    at most :data:`FACT_TIMEOUT_S` seconds, :data:`ASK_LIMIT` bytes of stdout, stdin
    ``/dev/null``); runs ``missing`` instead while ``user`` does not exist (a fresh host:
    nothing of it to read)."""
    if not user:
        raise ValueError("no training user given: refusing to run its files as the caller")
    u = shlex.quote(user)
    return (
        f"{AS_USER_FN}\n"
        f"if id -u {u} >/dev/null 2>&1; then "
        f"p40fleet_ask {FACT_TIMEOUT_S} {u} sh -c {shlex.quote(script)} </dev/null; "
        'p40fleet_r=$?; if [ "$p40fleet_r" -eq 124 ] || [ "$p40fleet_r" -eq 137 ]; then '
        f"echo '{ENDED} {FACT_TIMEOUT_S}'; fi; "
        f"else {missing}; fi; true"
    )


#: Root's staging directory for what it uploads for the training user (root-owned, mode 0700,
#: outside the home): root writes only here, the user's command reads the file on its stdin.
STAGE_DIR = "/var/lib/p40fleet/stage"


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
