"""Run pyinfra against the lab and read what happened: per-host changes, errors, bytes served.

Used by ``make demo`` (``python -m p40lab.demo``), the lab flow tests and the benchmarks, so
"a second run changes nothing" is counted the same way everywhere: an operation whose host line
says ``Success`` executed commands (a change); ``No changes`` executed none.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIM_INVENTORY = "inventories/sim.py"

_STATUS = re.compile(r"^\s*\[(?P<host>[^\]]+)\]\s+(?P<status>Success|No changes|Error)\b")
_CONNECTED = re.compile(r"^\s*\[(?P<host>[^\]]+)\]\s+Connected\b")
_OPERATION = re.compile(r"^--> Starting operation: (?P<name>.*?)\s*$")


@dataclass
class RunResult:
    """One pyinfra run: exit code, wall time, output, and per-host operation outcomes."""

    argv: list[str]
    returncode: int
    seconds: float
    output: str
    connected: list[str] = field(default_factory=list)
    changed: Counter = field(default_factory=Counter)
    unchanged: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    bytes_served: int | None = None
    operations: dict[str, dict[str, str]] = field(default_factory=dict)

    def operations_that(self, status: str, host: str) -> list[str]:
        """Names of the operations whose outcome on ``host`` was ``status``."""
        return [op for op, hosts in self.operations.items() if hosts.get(host) == status]

    def changed_operations(self, host: str) -> list[str]:
        """Names of the operations that executed commands on ``host`` (pyinfra's "Success")."""
        return self.operations_that("Success", host)

    def host_output(self, host: str, last: int = 60) -> str:
        """What went wrong on ``host``, for a failing test: its failed operations and the last
        ``last`` output lines that name it (pyinfra prefixes a host's lines with ``[host]``)."""
        mine = [line for line in self.output.splitlines() if f"[{host}]" in line]
        failed = ", ".join(self.operations_that("Error", host)) or "none by name"
        return f"{host}: failed operations: {failed}\n" + "\n".join(mine[-last:])

    def hosts_ok(self) -> list[str]:
        return [h for h in self.connected if not self.errors[h]]

    def summary(self) -> str:
        parts = [
            f"{h}: {self.changed[h]} changed, {self.unchanged[h]} unchanged, "
            f"{self.errors[h]} failed"
            for h in self.connected
        ]
        return "; ".join(parts)


def parse_operations(output: str) -> dict[str, dict[str, str]]:
    """``{operation name: {host: Success | No changes | Error}}`` in the order they ran."""
    operations: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in output.splitlines():
        if m := _OPERATION.match(line):
            current = operations.setdefault(m["name"], {})
        elif current is not None and (m := _STATUS.match(line)):
            current[m["host"]] = m["status"]
    return operations


def parse(output: str) -> tuple[list[str], Counter, Counter, Counter]:
    """Connected hosts and per-host counts of changed / unchanged / failed operations."""
    connected: list[str] = []
    changed, unchanged, errors = Counter(), Counter(), Counter()
    for line in output.splitlines():
        if m := _CONNECTED.match(line):
            if m["host"] not in connected:
                connected.append(m["host"])
        elif m := _STATUS.match(line):
            {"Success": changed, "No changes": unchanged, "Error": errors}[m["status"]][
                m["host"]
            ] += 1
    return connected, changed, unchanged, errors


def run(deploy: str, *args: str, inventory: str = SIM_INVENTORY, env: dict | None = None,
        timeout: float = 1800, echo: bool = False) -> RunResult:  # fmt: skip
    """``pyinfra -y INVENTORY DEPLOY ARGS`` from the repo root, counting mirror bytes served."""
    from p40lab import httpd

    # -y skips pyinfra's change detection, which is all a --dry run is for (it never prompts).
    yes = [] if "--dry" in args else ["-y"]
    argv = [sys.executable, "-m", "pyinfra", *yes, inventory, deploy, *args]
    since = time.time()
    t0 = time.monotonic()
    proc = subprocess.run(
        argv, cwd=REPO, text=True, stdin=subprocess.DEVNULL, timeout=timeout,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
    )  # fmt: skip
    seconds = time.monotonic() - t0
    if echo:
        sys.stdout.write(proc.stdout)
    connected, changed, unchanged, errors = parse(proc.stdout)
    try:
        served = httpd.bytes_served(since=since)
    except OSError:
        served = None
    return RunResult(
        argv, proc.returncode, seconds, proc.stdout, connected, changed, unchanged, errors, served,
        parse_operations(proc.stdout),
    )  # fmt: skip


def apex_builds(root: Path) -> list[str]:
    """The Apex stand-in's build lines on a lab host (``root``: its filesystem): each build's
    output is kept by p40fleet in ``/var/log/p40fleet/apex-build-KEY.log`` (appended)."""
    lines = []
    for log in sorted((Path(root) / "var/log/p40fleet").glob("apex-build-*.log")):
        lines += [  # pip -v indents the build's output
            line.strip().split(": ", 1)[1]
            for line in log.read_text(errors="replace").splitlines()
            if line.strip().startswith("p40lab-apex-build: ")
        ]
    return lines
