"""The lab's mirror server: p40fleet's own (``p40fleet.mirror.serve``: byte ranges, content
types) with the lab's access log (one line per request with the bytes sent) and a pid file.

It also serves the lab's stand-in for upstream (``/upstream/``, :mod:`p40lab.mirror`), to the
controller only: a host asking there gets 403, as an air-gapped host gets nothing from the
world. :func:`open_upstream` lets one host through (a host with a route out, e.g. the doubles'
own tests).

Started in the background by :func:`start_server` as ``python -m p40lab.mirror serve`` (the
name :func:`p40lab.procs.lab_processes` looks for), bound to this lab instance's controller
address only (p40lab.state: ``$P40LAB_INSTANCE``), so one instance never serves or stops
another's mirror.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

from p40fleet.mirror import serve as mirror_serve
from p40fleet.mirror.serve import RangeFileHandler
from p40lab import state as _lab
from p40lab.util import spawn_server

PID_FILE = _lab.LAB_DIR / "mirror.pid"
ACCESS_LOG = _lab.LAB_DIR / "mirror-access.log"
SERVER_LOG = _lab.LAB_DIR / "mirror-server.log"
BIND = _lab.CONTROLLER_IP
PORT = _lab.MIRROR_PORT
UPSTREAM = "upstream"  # the top dir of the mirror dir that stands in for the world
UPSTREAM_OPEN = _lab.LAB_DIR / "upstream-open"  # addresses let through, one per line


def upstream_open() -> set[str]:
    """The addresses besides the controller's that may reach upstream."""
    try:
        return set(UPSTREAM_OPEN.read_text().split())
    except OSError:
        return set()


def open_upstream(address: str, is_open: bool = True) -> None:
    """Let ``address`` reach upstream (or no longer): a host with a route out."""
    now = upstream_open() | {address} if is_open else upstream_open() - {address}
    UPSTREAM_OPEN.parent.mkdir(parents=True, exist_ok=True)
    UPSTREAM_OPEN.write_text("".join(f"{a}\n" for a in sorted(now)))


class _Handler(RangeFileHandler):
    """p40fleet's mirror server with the lab's access log (a fault test's host counts), and
    upstream answered to the controller only."""

    access_log: Path = ACCESS_LOG

    def send_head(self):
        rel = os.path.relpath(self.translate_path(self.path), self.directory)
        client = self.client_address[0]
        if rel.split(os.sep, 1)[0] == UPSTREAM and client != BIND:
            if client not in upstream_open():
                self.send_error(403, "Forbidden: upstream is not reachable from the lab's hosts")
                return None
        return super().send_head()


def serve(
    mirror_dir: Path,
    bind: str = BIND,
    port: int = PORT,
    access_log: Path = ACCESS_LOG,
    rate: int = 0,
    ranges: bool = True,
):
    mirror_serve.serve(mirror_dir, bind, port, access_log, rate, ranges, handler=_Handler)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def start_server(
    mirror_dir: Path | None = None,
    bind: str = BIND,
    port: int = PORT,
    *,
    access_log: Path = ACCESS_LOG,
    pid_file: Path = PID_FILE,
    timeout: float = 10.0,
    rate: int = 0,
    ranges: bool = True,
) -> int:
    """Start ``python -m p40lab.mirror serve`` in the background, bound ONLY to ``bind``.
    Writes ``pid_file``; returns the PID once the port accepts connections. ``rate``: bytes/s
    per response (0: unthrottled), to cut a download halfway in a fault test; ``ranges=False``:
    a mirror without Range support (as ``python3 -m http.server``)."""
    mirror_dir = Path(mirror_dir or _lab.MIRROR_DIR)
    stop_server(pid_file=pid_file)
    args = ["p40lab.mirror", "serve", "--dir", str(mirror_dir), "--bind", bind,
            "--port", str(port), "--access-log", str(access_log), "--rate", str(rate)]  # fmt: skip
    return spawn_server(
        args + ([] if ranges else ["--no-ranges"]),
        bind=bind,
        port=port,
        pid_file=pid_file,
        server_log=access_log.with_name("mirror-server.log"),
        what="mirror server",
        stop=lambda: stop_server(pid_file=pid_file),
        timeout=timeout,
    )


def answers(base_url: str, timeout: float = 2.0) -> bool:
    """True when a server answers at ``base_url``."""
    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/", timeout=timeout):  # noqa: S310
            return True
    except OSError:
        return False


def stop_server(*, pid_file: Path = PID_FILE) -> bool:
    """Stop the server recorded in ``pid_file`` (by PID). True when one was running."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return False
    was = _pid_alive(pid)
    if was:
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            if not _pid_alive(pid):
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
    return was


def access_entries(access_log: Path = ACCESS_LOG) -> list[dict[str, Any]]:
    out = []
    try:
        lines = access_log.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(" ")
        if len(parts) != 6:
            continue
        ts, client, method, path, status, sent = parts
        out.append({"time": float(ts), "client": client, "method": method, "path": path,
                    "status": int(status), "bytes": int(sent)})  # fmt: skip
    return out


def bytes_served(
    access_log: Path = ACCESS_LOG, *, since: float = 0.0, path_prefix: str = ""
) -> int:
    """Total body bytes sent (optionally since a time / under a path prefix)."""
    return sum(
        e["bytes"]
        for e in access_entries(access_log)
        if e["time"] >= since and e["path"].startswith(path_prefix)
    )
