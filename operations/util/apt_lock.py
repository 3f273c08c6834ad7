"""apt steps that wait for the dpkg lock instead of failing at once.

Right after boot a focal server's ``unattended-upgrades`` (``apt-daily``/``apt-daily-upgrade``)
holds ``/var/lib/dpkg/lock-frontend`` for minutes, and ``apt-get`` exits 100 at once ("Could not
get lock"). Every apt command of the project runs through :func:`guarded`: a POSIX-sh loop waits
while a process has one of :data:`LOCK_FILES` open and holds a lock (``/proc/*/fd`` and
``/proc/locks``: focal has no ``fuser``/``lsof`` guarantee, and apt's locks are ``fcntl`` locks
a ``flock`` probe cannot see), printing who holds it every :data:`PROGRESS_EVERY_S` seconds;
then apt runs with ``-o DPkg::Lock::Timeout=`` (apt >= 1.9.11; focal: 2.0) for what is left of
the bound (the lock can be taken again between the loop and apt). Past the bound the step
fails naming the host, the step, the holder and the fix. The output streams at pyinfra's
default verbosity (:func:`operations.util.progress.streamed`).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator

from pyinfra.api import FunctionCommand, StringCommand
from pyinfra.operations import apt

from p40fleet.operations.util.progress import streamed
from p40fleet.proxy import proxied
from p40fleet.spec import Proxy

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "LOCK_FILES",
    "PROGRESS_EVERY_S",
    "REST",
    "guarded",
    "lock_option",
    "packages",
    "update",
]

#: What apt and dpkg lock (frontend, dpkg's own, the lists and the download cache).
LOCK_FILES = (
    "/var/lib/dpkg/lock-frontend",
    "/var/lib/dpkg/lock",
    "/var/lib/apt/lists/lock",
    "/var/cache/apt/archives/lock",
)
#: The bound on the whole wait (``stack.policy.dpkg_lock_wait_s`` sets it per spec).
DEFAULT_TIMEOUT_S = 600
PROGRESS_EVERY_S = 15
#: The shell variable holding the seconds left once the loop is through (see :func:`guarded`).
REST = '"$p40_rest"'


def lock_option(timeout_s: int | str = DEFAULT_TIMEOUT_S) -> str:
    """apt's own wait for the lock: ``-o DPkg::Lock::Timeout=N`` (apt >= 1.9.11)."""
    return f"-o DPkg::Lock::Timeout={timeout_s}"


def _holders_function() -> str:
    """``p40_holders``: ``PID N (command line)`` of each process with a lock file open that
    holds a lock (an apt waiting for it has it open too, and holds none)."""
    names = " -o ".join(f"-lname {path}" for path in LOCK_FILES)
    return (
        "p40_holders() { s=; "
        f"for p in $(find /proc/[0-9]*/fd -maxdepth 1 \\( {names} \\) 2>/dev/null "
        "| cut -d/ -f3 | sort -un); do "
        # holding, not waiting: the process owns a lock (/proc/locks: N: POSIX ADVISORY WRITE PID)
        "awk -v p=\"$p\" '$5 == p {f = 1} END {exit !f}' /proc/locks 2>/dev/null || continue; "
        "c=$(tr '\\0\\n' '  ' 2>/dev/null < /proc/$p/cmdline | cut -c1-160); "
        'printf "%sPID %s (%s)" "$s" "$p" "${c% }"; s=", "; '
        "done; }"
    )


def wait_script(host_name: str, step: str, timeout_s: int) -> str:
    """The loop run before apt: waits at most ``timeout_s`` while the lock is held."""
    where, q = f"{host_name}: {step}", shlex.quote
    still = f"{where}: the dpkg lock is still held after {int(timeout_s)} s by "
    fix = (
        "Fix: let it finish (after boot it is unattended-upgrades: "
        "tail /var/log/unattended-upgrades/unattended-upgrades.log), or stop it "
        "(systemctl stop apt-daily.service apt-daily-upgrade.service unattended-upgrades), "
        "or raise stack.policy.dpkg_lock_wait_s; then re-run"
    )
    return "\n".join(
        [
            _holders_function(),
            f"p40_t={int(timeout_s)}; p40_start=$(date +%s); p40_next=0",
            'while p40_h=$(p40_holders); [ -n "$p40_h" ]; do',
            "    p40_w=$(( $(date +%s) - p40_start ))",
            # date +%s ticks whole seconds: a difference of t + 1 is more than t s really waited
            '    if [ "$p40_w" -gt "$p40_t" ]; then',
            f'        echo {q(still)}"$p40_h". {q(fix)} >&2',
            "        exit 1",
            "    fi",
            '    if [ "$p40_w" -ge "$p40_next" ]; then',
            f"        echo {q(f'{where}: waiting for the dpkg lock')}"
            ' "($p40_w s of $p40_t s): held by $p40_h"',
            f"        p40_next=$((p40_w + {PROGRESS_EVERY_S}))",
            "    fi",
            "    sleep 1",
            "done",
            "p40_rest=$(( p40_t - ($(date +%s) - p40_start) )); "
            '[ "$p40_rest" -ge 1 ] || p40_rest=1',
        ]
    )


def _text(command: str | StringCommand) -> str:
    return command.get_raw_value() if isinstance(command, StringCommand) else str(command)


def guarded(
    command: str | StringCommand,
    host_name: str,
    step: str,
    timeout_s: int = DEFAULT_TIMEOUT_S,
    failed: str = "",
) -> FunctionCommand:
    """``command`` (an apt-get command line) once the lock is free, streamed. When it fails,
    the holder is named if the lock is held again, else ``failed`` (cause and fix) is said."""
    held = shlex.quote(f"{host_name}: {step}: apt failed while the dpkg lock is held by ")
    other = f"echo {shlex.quote(failed)} >&2" if failed else ":"
    script = "\n".join(
        [
            wait_script(host_name, step, timeout_s),
            f"{_text(command)} || {{ p40_rc=$?; p40_h=$(p40_holders)",
            f'    if [ -n "$p40_h" ]; then echo {held}"$p40_h" >&2; else {other}; fi',
            "    exit $p40_rc; }",
        ]
    )
    return streamed(StringCommand(script), f"{step}: apt")


def update(
    host_name: str, step: str, timeout_s: int = DEFAULT_TIMEOUT_S, proxy: Proxy | None = None
) -> FunctionCommand:
    """``apt-get update`` waiting for the lock (through ``stack.proxy`` when set)."""
    command = proxied(f"apt-get -q {lock_option(REST)} update", proxy)
    return guarded(command, host_name, step, timeout_s)


def packages(
    names: list[str],
    host_name: str,
    step: str,
    timeout_s: int = DEFAULT_TIMEOUT_S,
    proxy: Proxy | None = None,
) -> Iterator[FunctionCommand]:
    """pyinfra's ``apt.packages`` (``update`` first) with every apt command waiting for the
    lock and going through ``proxy``; nothing when ``DebPackages`` has them all."""
    install = list(apt.packages._inner(packages=names, extra_install_args=lock_option(REST)))
    if not install:
        return
    yield update(host_name, step, timeout_s, proxy)
    for command in install:
        yield guarded(proxied(_text(command), proxy), host_name, step, timeout_s)
