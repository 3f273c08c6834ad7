"""One p40fleet run per host at a time: the lock's holder, its staleness and its shell commands.

The lock is a directory on the host (``/var/lib/p40fleet/run.lock``) holding a ``holder`` file::

    controller=ctl-01
    controller_id=8f2e…
    pid=41234
    run=3f9c0a1b2c4d
    host=lab2
    since=2026-11-30T23:10:02Z
    boot_id=6d0c…

``controller`` is the controller's hostname, for people to read; ``controller_id`` is who the
controller is (``p40fleet.controller.controller_id``: a random id kept in its cache dir, since
cloned VMs and laptops share hostnames). ``since`` and ``boot_id`` are written by the host
itself (its clock, its boot): the lock's age is measured on the host's clock, never on that of
a controller that may be hours off.

It is taken by renaming a complete temporary directory onto that name (``mv -T``: rename(2)
fails when the target is a non-empty directory), so the lock never exists without its holder
and of two runs that both saw no lock exactly one wins. A stale lock is taken over by renaming
it to a name derived from its exact content: two runs that saw the same stale lock race for one
name and only one rename succeeds; the other then finds the winner's holder and is refused.

Stale means: the holder is this controller (same ``controller_id``) and its pid no longer runs
pyinfra (a crashed or killed run), or the holder is another controller and either the host has
rebooted since (boot_id changed) and been up for :data:`BOOT_GRACE_S` (a run that reboots the
host itself refreshes the boot_id when it is back: the grace lets it), or the lock is older than
:data:`MAX_AGE_S` by the host's clock. A refresh that finds the lock no longer this run's exits
75, so that host fails loudly instead of carrying on unlocked. Pure functions:
``operations.run_lock`` gathers the facts and runs the commands.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

__all__ = [
    "BOOT_GRACE_S",
    "DEFAULT_PATH",
    "MAX_AGE_S",
    "Decision",
    "Holder",
    "acquire_command",
    "decide",
    "parse_holder",
    "pid_runs_pyinfra",
    "refresh_command",
    "release_command",
]

DEFAULT_PATH = "/var/lib/p40fleet/run.lock"
#: A lock from another controller older than this is stale: longer than any real run (a cold
#: host's CUDA download, install and Apex build take about an hour), short enough that a lock
#: left by a controller that died is not in the way for more than a day.
MAX_AGE_S = 24 * 3600
MAX_AGE_H = MAX_AGE_S // 3600
#: A lock of another controller whose host rebooted is stale only once the host has been up this
#: long: the run that rebooted it reconnects and refreshes its holder well within it.
BOOT_GRACE_S = 15 * 60
BOOT_ID = "/proc/sys/kernel/random/boot_id"
_FIELDS = ("controller", "controller_id", "pid", "run", "host", "since", "boot_id")
#: The holder lines the host writes itself: its clock and its boot.
_HOST_FIELDS = ("since", "boot_id")
SINCE_SHELL = "since=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
FIX = (
    "wait for that run to end; if it is gone (its controller crashed or lost the host), "
    "remove the lock on the host with `rm -rf {path}` and re-run"
)


@dataclass(frozen=True)
class Holder:
    """Who holds (or wants) the lock."""

    controller: str  # the controller's hostname: for display only
    pid: int
    run: str
    host: str
    since: str = ""  # UTC, ISO 8601 with Z, by the host's clock
    boot_id: str = ""
    controller_id: str = ""  # who the controller is (empty: a lock of an earlier version)

    def lines(self, host_shell: bool = False) -> list[str]:
        """The holder file's lines; with ``host_shell`` the host writes ``since`` and
        ``boot_id`` itself (``acquire_command``/``refresh_command`` append them)."""
        names = [n for n in _FIELDS if not (host_shell and n in _HOST_FIELDS)]
        return [f"{name}={getattr(self, name)}" for name in names]

    def describe(self) -> str:
        return f"run {self.run} of controller {self.controller} (pid {self.pid}) since {self.since}"


def parse_holder(text: str | None) -> Holder | None:
    """A holder file's text → :class:`Holder`; None when a field is missing or malformed."""
    if not text:
        return None
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    values.setdefault("controller_id", "")  # written by every version since N8
    try:
        return Holder(**{name: values[name] for name in _FIELDS if name != "pid"},
                      pid=int(values["pid"]))  # fmt: skip
    except (KeyError, ValueError):
        return None


def pid_runs_pyinfra(pid: int) -> bool:
    """Whether ``pid`` is a live pyinfra process on this machine (a reused pid is not)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return b"pyinfra" in handle.read()
    except OSError:
        return False


def _age_s(since: str, now: datetime) -> float | None:
    try:
        moment = datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    return (now - moment).total_seconds()


@dataclass(frozen=True)
class Decision:
    """What the prepare stage saw: ``free``, ``ours`` (re-entrant), ``stale`` or ``held``."""

    kind: str
    message: str = ""
    stale_text: str | None = None  # the exact holder text a takeover replaces


def decide(
    exists: bool,
    text: str,
    boot_id: str,
    me: Holder,
    *,
    now: datetime | None = None,
    uptime_s: float | None = None,
    pid_alive: Callable[[int], bool] = pid_runs_pyinfra,
) -> Decision:
    """Decide from the lock seen on the host (``exists``, holder ``text``, the host's
    ``boot_id``, clock ``now`` and ``uptime_s``) what this run does. Without the host's clock
    the controller's is used; without its uptime a reboot alone takes nothing over."""
    if not exists:
        return Decision("free")
    holder = parse_holder(text)
    if holder is None:
        return Decision("held", f"the lock holds no readable holder file ({text[:200]!r})")
    same_controller = bool(holder.controller_id) and holder.controller_id == me.controller_id
    if holder.run == me.run and same_controller:
        if holder.host == me.host:
            return Decision("ours")
        return Decision(
            "held",
            f"this run holds it already as host {holder.host}: the same machine is listed "
            "twice in the inventory",
        )
    now = now or datetime.now(timezone.utc)
    held = f"another p40fleet run holds this host: {holder.describe()}"
    age = _age_s(holder.since, now)
    if same_controller:
        if pid_alive(holder.pid):
            return Decision("held", held)
        why = f"its pid {holder.pid} no longer runs on {me.controller} (crashed or killed)"
    else:
        rebooted = bool(boot_id and holder.boot_id and holder.boot_id != boot_id)
        if rebooted and uptime_s is not None and uptime_s >= BOOT_GRACE_S:
            why = "the host has rebooted since (boot_id changed)"
        elif age is not None and age > MAX_AGE_S:
            why = f"it is {age / 3600:.0f} h old by the host's clock (stale after {MAX_AGE_H} h)"
        elif rebooted and uptime_s is not None:
            return Decision(
                "held",
                f"{held}; the host rebooted {uptime_s / 60:.0f} min ago and that run may still "
                f"refresh it (stale {BOOT_GRACE_S // 60} min after the reboot if it does not)",
            )
        else:  # a live lock, or a reboot whose time the host did not say: no takeover on a guess
            return Decision("held", held)
    return Decision("stale", f"took over the stale lock of {holder.describe()}: {why}", text)


def stale_name(path: str, text: str) -> str:
    """Where a takeover moves a stale lock: a name both racers for it compute alike."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"{path}.stale-{digest}"


def acquire_command(path: str, me: Holder, stale_text: str | None = None) -> str:
    """Shell (POSIX sh, GNU mv) that takes the lock for ``me`` or exits 75 naming the holder.

    Exit 0: taken, or already held by this run for this host. With ``stale_text`` it first
    moves a lock whose holder is exactly that text out of the way (and says so).
    """
    q = shlex.quote
    parent = posixpath.dirname(path)
    holder = " ".join(q(line) for line in me.lines(host_shell=True))
    lines = [
        f"L={q(path)}",
        f"mkdir -p {q(parent)} || exit 1",
        # take-over leftovers older than a day go (a racer's rename needs today's to stay)
        f"find {q(parent)} -maxdepth 1 -name {q(posixpath.basename(path) + '.stale-*')} "
        "-mmin +1440 -exec rm -rf {} + 2>/dev/null",
        f"t=$(mktemp -d {q(path + '.new.XXXXXX')}) || exit 1",
        f'printf "%s\\n" {holder} "{SINCE_SHELL}" "boot_id=$(cat {BOOT_ID})" > "$t/holder" '
        '|| { rm -rf "$t"; exit 1; }',
    ]
    if stale_text is not None:
        lines.append(
            f'if [ "$(cat "$L/holder" 2>/dev/null)" = {q(stale_text)} ] && '
            f'mv -T "$L" {q(stale_name(path, stale_text))} 2>/dev/null; then '
            "echo 'p40fleet: stale run lock moved aside'; fi"
        )
    lines += [
        'if mv -T "$t" "$L" 2>/dev/null; then exit 0; fi',
        'rm -rf "$t"',
        'cur=$(cat "$L/holder" 2>/dev/null)',
        f'if printf "%s\\n" "$cur" | grep -qxF {q("run=" + me.run)} && '
        f'printf "%s\\n" "$cur" | grep -qxF {q("host=" + me.host)}; then exit 0; fi',
        f'echo "p40fleet run lock {path} is held:" >&2',
        'printf "%s\\n" "$cur" >&2',
        "exit 75",
    ]
    return "\n".join(lines)


def _mine(path: str, me: Holder) -> str:
    q = shlex.quote
    return (
        f"grep -qxF {q('run=' + me.run)} {q(path + '/holder')} 2>/dev/null && "
        f"grep -qxF {q('host=' + me.host)} {q(path + '/holder')}"
    )


def release_command(path: str, me: Holder) -> str:
    """Shell that removes the lock only when this run (for this host) holds it."""
    q = shlex.quote
    return f"if {_mine(path, me)}; then rm -rf {q(path)}; fi; true"


def refresh_command(path: str, me: Holder) -> str:
    """Shell that writes the host's new boot_id (and clock) into our holder after our own
    reboot; exits 75 naming the holder when the lock is no longer this run's (another run took
    it over meanwhile): that host must fail, not go on without the lock."""
    q = shlex.quote
    holder = " ".join(q(line) for line in me.lines(host_shell=True))
    tmp = path + "/holder.new"
    lost = (
        f"p40fleet run lock {path} is no longer held by run {me.run} (taken over after the reboot):"
    )
    return (
        f"if {_mine(path, me)}; then "
        f'printf "%s\\n" {holder} "{SINCE_SHELL}" "boot_id=$(cat {BOOT_ID})" > {q(tmp)} && '
        f"mv -f {q(tmp)} {q(path + '/holder')}; else "
        f"echo {q(lost)} >&2; cat {q(path + '/holder')} >&2 2>/dev/null; exit 75; fi"
    )


def new_run_id() -> str:
    """A random run id (12 hex)."""
    return os.urandom(6).hex()
