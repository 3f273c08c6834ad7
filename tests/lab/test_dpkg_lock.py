"""A fresh host whose boot holds the dpkg lock (unattended-upgrades on a new focal server): the
first run's apt steps wait for it, say who holds it, and the run converges without a retry."""

from __future__ import annotations

import time

import pytest

from p40lab import dpkg_lock, runs

pytestmark = pytest.mark.lab

HOLD_S = 30


def lock_holder(lab, name: str) -> str:
    """The command line of the process holding the dpkg frontend lock on ``name`` ("" = none)."""
    probe = (
        "for p in $(find /proc/[0-9]*/fd -maxdepth 1 -lname /var/lib/dpkg/lock-frontend "
        "2>/dev/null | cut -d/ -f3 | sort -u); do tr '\\0' ' ' < /proc/$p/cmdline; done"
    )
    return lab.ssh(name, probe).stdout.strip()


def test_a_boot_holding_the_dpkg_lock_converges_without_a_retry(lab, tmp_path):
    lab.reinstall("lab1", keep_host_key=True)  # fresh: every apt step is due
    dpkg_lock.hold_at_boot(lab.root("lab1"), HOLD_S)
    try:
        lab.reboot("lab1")
        booted = time.monotonic()
        assert "unattended-upgrade" in lock_holder(lab, "lab1")  # the fault is in place
        # apt as it was: both commands a deploy sends exit 100 at once while the locks are held
        bare = lab.ssh("lab1", "apt-get -y install p40lab-no-such-package")
        assert bare.returncode == 100, bare.stderr
        assert "Could not get lock /var/lib/dpkg/lock-frontend" in bare.stderr, bare.stderr
        bare = lab.ssh("lab1", "apt-get -q update")
        assert bare.returncode == 100, bare.stderr
        assert "Could not get lock /var/lib/apt/lists/lock" in bare.stderr, bare.stderr
        result = runs.run(
            "deploy/system.py", "--limit", "lab1", env={"P40FLEET_CACHE": str(tmp_path)}
        )
        lines = [line for line in result.output.splitlines() if "[lab1]" in line]
        assert result.returncode == 0 and not result.errors["lab1"], result.output[-5000:]
        waited = [line for line in lines if "waiting for the dpkg lock" in line]
        assert waited, "\n".join(lines[-60:])
        assert "held by PID" in waited[0] and "unattended-upgrade" in waited[0], waited[0]
        assert "/var/log/unattended-upgrades" not in waited[0]  # a progress line, not the error
        assert time.monotonic() - booted >= HOLD_S  # it waited the holder out, no retry
        assert "nvidia-smi answers with the pinned driver" in result.output
        took = f"{result.seconds:.1f} s, {len(waited)} progress line(s):"
        print(
            f"\ndeploy/system.py, boot holding the dpkg lock {HOLD_S} s: {took}", *waited, sep="\n"
        )
        again = runs.run(
            "deploy/system.py", "--limit", "lab1", env={"P40FLEET_CACHE": str(tmp_path)}
        )
        assert again.returncode == 0 and not again.changed_operations("lab1"), again.output[-3000:]
        print(f"re-run: {again.seconds:.1f} s, 0 changed")
    finally:
        dpkg_lock.release(lab.root("lab1"))
