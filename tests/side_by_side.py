"""``make test``: the lab tests and the unit tests as two pytest sessions side by side.

The lab tests (``-m lab``) are most of the wall time and wait on the lab's hosts much of it;
the unit tests (``-m "not lab"``) run in a second process meanwhile instead of after them. The
lab session prints as it goes; the unit session's output is kept in a log and printed whole
when it ends, so the two never interleave. The lab's base image is built (or found current)
first: some unit tests read it. The unit session runs as lab instance ``unit``, never the lab
session's ``test``. Exit status: 0 only when both sessions pass.

    python tests/side_by_side.py [PYTEST_ARGS...]   # extra args go to both sessions
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The unit session's own lab instance (tests/conftest.py): a unit test that writes a lab's
#: state (paths, stack overrides) never writes the one the lab session's hosts are reading.
UNIT_INSTANCE = "unit"
sys.path.insert(0, str(ROOT))  # run as a script: p40lab is the checkout's, as pytest sees it


def pytest_cmd(marker: str, cache: str, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-ra", "--durations=25", "-m", marker,
            "-o", f"cache_dir=.pytest_cache/{cache}", *extra]  # fmt: skip


def side_by_side(lab_cmd: list[str], unit_cmd: list[str], build: Callable[[], object]) -> int:
    """``build()``, then ``unit_cmd`` in the background (its output kept in a log) while
    ``lab_cmd`` runs in the foreground; the log printed when both ended, then one line of both
    exit codes and the wall time. Returns 0 only when both exited 0."""
    build()
    t0 = time.monotonic()
    with tempfile.NamedTemporaryFile("w+", prefix="p40fleet-unit-tests.", suffix=".log") as log:
        unit = subprocess.Popen(
            unit_cmd,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "P40LAB_TEST_INSTANCE": UNIT_INSTANCE},
        )
        done: list[float] = []
        waiter = threading.Thread(target=lambda: (unit.wait(), done.append(time.monotonic())))
        waiter.start()
        print(f"side by side: unit tests (pid {unit.pid}) log to {log.name}", flush=True)
        try:
            lab_rc = subprocess.call(lab_cmd, cwd=ROOT)
        except BaseException:  # Ctrl-C: the unit session goes too
            unit.terminate()
            raise
        lab_s = time.monotonic() - t0
        waiter.join()
        unit_rc, unit_s = unit.returncode, done[0] - t0
        log.seek(0)
        print(f"\n{'=' * 30} unit tests (-m 'not lab') {'=' * 30}", flush=True)
        sys.stdout.write(log.read())
    print(
        f"\nside by side: lab tests exit {lab_rc} ({lab_s:.0f} s), "
        f"unit tests exit {unit_rc} ({unit_s:.0f} s); wall {time.monotonic() - t0:.0f} s",
        flush=True,
    )
    return 0 if lab_rc == unit_rc == 0 else 1


def main(extra: list[str]) -> int:
    from p40lab import base

    # base.build is a no-op when the image is current
    return side_by_side(
        pytest_cmd("lab", "lab", extra), pytest_cmd("not lab", "unit", extra), base.build
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
