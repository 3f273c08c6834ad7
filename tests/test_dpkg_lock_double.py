"""p40lab.dpkg_lock: the unattended-upgrade double takes apt's locks the way apt sees them (POSIX
fcntl write locks), holds them the configured time, then lets go; the boot hook starts it."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time

from p40lab import dpkg_lock


def _locked_by_other(path) -> bool:
    """What apt's GetLock sees: can this process take an fcntl write lock on ``path``?"""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def test_hold_at_boot_writes_the_double_and_its_boot_hook(tmp_path):
    written = dpkg_lock.hold_at_boot(tmp_path, 12)
    assert [p.relative_to(tmp_path).as_posix() for p in written] == [
        dpkg_lock.DOUBLE, dpkg_lock.BOOT_HOOK, dpkg_lock.HOLD_FILE,
    ]  # fmt: skip
    hook = (tmp_path / dpkg_lock.BOOT_HOOK).read_text()
    assert "setsid /usr/bin/unattended-upgrade" in hook and hook.rstrip().endswith("&")
    assert os.access(tmp_path / dpkg_lock.BOOT_HOOK, os.X_OK)
    assert (tmp_path / dpkg_lock.HOLD_FILE).read_text().strip() == "12"
    dpkg_lock.release(tmp_path)
    assert not any((tmp_path / rel).exists() for rel in (dpkg_lock.DOUBLE, dpkg_lock.BOOT_HOOK))


def test_the_double_holds_fcntl_locks_for_the_time_then_releases(tmp_path):
    dpkg_lock.hold_at_boot(tmp_path, 2)
    source = (tmp_path / dpkg_lock.DOUBLE).read_text()
    locks = [tmp_path / os.path.basename(p) for p in dpkg_lock.LOCKS]
    for real, fake in zip(dpkg_lock.LOCKS, locks, strict=True):
        source = source.replace(repr(real), repr(str(fake)))
    source = source.replace(f"/{dpkg_lock.HOLD_FILE}", str(tmp_path / dpkg_lock.HOLD_FILE))
    source = source.replace("/var/log/unattended-upgrades", str(tmp_path / "log"))
    proc = subprocess.Popen([sys.executable, "-c", source])
    try:
        deadline = time.monotonic() + 10
        while not all(p.exists() for p in locks) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        assert all(_locked_by_other(p) for p in locks)
        assert proc.wait(timeout=15) == 0
        assert not any(_locked_by_other(p) for p in locks)
        log = (tmp_path / "log/unattended-upgrades.log").read_text()
        assert "holding the dpkg lock 2.0 s" in log and "All upgrades installed" in log
    finally:
        proc.kill()
