"""Small helpers shared by the lab modules: logging, running commands, file digests, servers."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from p40lab.state import LabError


def log(msg: str) -> None:
    print(f"[p40lab {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(
    cmd: Sequence[str], *, check: bool = True, quiet: bool = False, **kw
) -> subprocess.CompletedProcess:
    """Run a command; on failure raise LabError with its stderr (unless check=False)."""
    kw.setdefault("text", True)
    if quiet or check:
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
    try:
        proc = subprocess.run(list(cmd), **kw)
    except FileNotFoundError as exc:
        raise LabError(f"command not found: {cmd[0]}") from exc
    if check and proc.returncode != 0:
        err = (proc.stderr or proc.stdout or "").strip()
        raise LabError(f"`{' '.join(cmd)}` failed (rc={proc.returncode}): {err}")
    return proc


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks (the doubles and wheels run to GBs)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the simulated lab needs root (netns, overlayfs, mounts): run it as root")


def spawn_server(
    args: Sequence[str],
    *,
    bind: str,
    port: int,
    pid_file: Path,
    server_log: Path,
    what: str,
    stop: Callable[[], object],
    timeout: float = 10.0,
) -> int:
    """Start ``python -m ARGS`` (a lab server, with this checkout on ``PYTHONPATH``) in its own
    session, its output appended to ``server_log``; write ``pid_file`` and return the PID once
    ``bind:port`` accepts connections. Raise RuntimeError (after ``stop()``) when it exits or
    does not listen within ``timeout`` seconds."""
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    server_log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(server_log, "a") as errlog:
        proc = subprocess.Popen(
            [sys.executable, "-m", *args], stdin=subprocess.DEVNULL, stdout=errlog,
            stderr=errlog, env=env, start_new_session=True,
        )  # fmt: skip
    pid_file.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited (rc={proc.returncode}); see {server_log}")
        try:
            with socket.create_connection((bind, port), timeout=0.5):
                return proc.pid
        except OSError:
            time.sleep(0.05)
    stop()
    raise RuntimeError(f"{what} did not start listening on {bind}:{port}")
