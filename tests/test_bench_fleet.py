"""bench_fleet's host CPU reading waits for every ended session to be reaped."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_fleet  # noqa: E402

# A parent of its own (this test process may reap its children at once: a SIGCHLD handler or
# SIG_IGN another module set), which forks a child that exits, reaps it when told, then waits.
PARENT = """
import os, signal, sys
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
pid = os.fork()
if pid == 0:
    os._exit(0)
print(pid, flush=True)
sys.stdin.readline()
os.waitpid(pid, 0)
print("reaped", flush=True)
sys.stdin.readline()
"""


def wait_for(condition, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_unreaped_finds_an_exited_child_until_its_parent_reaps_it():
    """A zombie has no ``root`` link, so the reading cannot see it; a host whose ssh session was
    still a zombie read 0 s for the whole run (and its next run twice as much)."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        child = int(parent.stdout.readline())
        assert wait_for(lambda: child in bench_fleet.unreaped({parent.pid}))
        assert bench_fleet.unreaped({child}) == []  # only children of the pids asked about
        parent.stdin.write("reap\n")
        parent.stdin.flush()
        assert parent.stdout.readline() == "reaped\n"
        assert child not in bench_fleet.unreaped({parent.pid})
    finally:
        parent.kill()
        parent.wait()
