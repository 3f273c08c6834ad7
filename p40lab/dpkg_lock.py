"""A lab host whose boot holds the dpkg lock, as a fresh Ubuntu 20.04 server's does.

On focal, soon after boot ``apt-daily.service`` refreshes the package lists (holding
``/var/lib/apt/lists/lock``) and ``apt-daily-upgrade.service`` runs ``unattended-upgrade``,
which holds ``/var/lib/dpkg/lock-frontend`` and ``/var/lib/dpkg/lock`` (apt's ``fcntl`` write
locks) for minutes; meanwhile ``apt-get update`` and ``apt-get install`` exit 100 ("Could not
get lock ... It is held by process N (unattended-upgr)"). :func:`hold_at_boot` installs a
double of that pair into a host's disk: ``/usr/bin/unattended-upgrade`` (python3, as the real
one; it takes the same three locks with ``fcntl.lockf`` the way apt does, logs to
``/var/log/unattended-upgrades/``, holds them ``seconds`` and exits). The real two hold theirs
one after the other; the double holds them at once, so both apt commands a deploy sends meet
the lock whenever it comes within ``seconds`` of boot. A boot hook
(``/etc/p40lab-sim/boot.d/40-unattended-upgrades``) starts it in the background at every boot,
before sshd answers. :func:`release` removes both.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BOOT_HOOK", "DOUBLE", "LOCKS", "hold_at_boot", "release"]

DOUBLE = "usr/bin/unattended-upgrade"
BOOT_HOOK = "etc/p40lab-sim/boot.d/40-unattended-upgrades"
HOLD_FILE = "etc/p40lab-sim/unattended-upgrade-seconds"
LOCKS = ("/var/lib/apt/lists/lock", "/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock")

DOUBLE_SOURCE = '''#!/usr/bin/python3
"""p40lab double of unattended-upgrade: holds the dpkg locks like the real one, then exits."""
import fcntl
import os
import sys
import time

LOCKS = %(locks)r
HOLD_FILE = "/%(hold_file)s"
LOG = "/var/log/unattended-upgrades/unattended-upgrades.log"


def log(msg):
    os.makedirs(os.path.dirname(LOG), exist_ok=True)
    with open(LOG, "a") as fh:
        fh.write(time.strftime("%%Y-%%m-%%d %%H:%%M:%%S,000 INFO ") + msg + "\\n")


def main():
    try:
        with open(HOLD_FILE) as fh:
            seconds = float(fh.read().strip() or 0)
    except OSError:
        seconds = 0.0
    fds = []
    for path in LOCKS:  # the lists (apt-daily), then apt's order: the frontend, dpkg's own
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
        fcntl.lockf(fd, fcntl.LOCK_EX)  # a POSIX (fcntl) write lock, as apt takes it
        fds.append(fd)
    log("Starting unattended upgrades script (p40lab double: holding the dpkg lock %%s s)"
        %% seconds)
    time.sleep(seconds)
    log("All upgrades installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''

BOOT_SCRIPT = """#!/bin/sh
# p40lab: apt-daily-upgrade at boot: unattended-upgrade holds the dpkg lock for a while
setsid /%(double)s </dev/null >/dev/null 2>&1 &
"""


def hold_at_boot(root: Path, seconds: float = 30) -> list[Path]:
    """From the next boot of the host with disk ``root`` on, its boot holds the dpkg lock
    ``seconds``. Returns the paths written."""
    root = Path(root)
    double, hook, hold = root / DOUBLE, root / BOOT_HOOK, root / HOLD_FILE
    for path in (double, hook, hold):
        path.parent.mkdir(parents=True, exist_ok=True)
    double.write_text(DOUBLE_SOURCE % {"locks": LOCKS, "hold_file": HOLD_FILE})
    double.chmod(0o755)
    hook.write_text(BOOT_SCRIPT % {"double": DOUBLE})
    hook.chmod(0o755)
    hold.write_text(f"{seconds}\n")
    return [double, hook, hold]


def release(root: Path) -> None:
    """No more lock at boot (a running holder still ends on its own)."""
    for rel in (BOOT_HOOK, HOLD_FILE, DOUBLE):
        (Path(root) / rel).unlink(missing_ok=True)
