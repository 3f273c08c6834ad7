"""bench_fleet's host CPU reading waits for every ended session to be reaped."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_fleet  # noqa: E402


def test_unreaped_finds_an_exited_child_until_its_parent_reaps_it():
    """A zombie has no ``root`` link, so the reading cannot see it; a host whose ssh session was
    still a zombie read 0 s for the whole run (and its next run twice as much)."""
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while child.pid not in bench_fleet.unreaped({os.getpid()}) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert child.pid in bench_fleet.unreaped({os.getpid()})
    assert bench_fleet.unreaped({child.pid}) == []  # only children of the pids asked about
    child.wait()
    assert child.pid not in bench_fleet.unreaped({os.getpid()})
