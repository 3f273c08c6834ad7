"""The mirror's HTTP server: the standard library's file server with single byte ranges, an
access log (one line per request with the bytes sent) and a pid file.

Started in the background by :func:`start_server` as ``python -m p40lab.mirror serve`` (the
name :func:`p40lab.procs.lab_processes` looks for), bound to this lab instance's controller
address only (p40lab.state: ``$P40LAB_INSTANCE``), so one instance never serves or stops
another's mirror.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from p40lab import state as _lab
from p40lab.util import spawn_server

PID_FILE = _lab.LAB_DIR / "mirror.pid"
ACCESS_LOG = _lab.LAB_DIR / "mirror-access.log"
SERVER_LOG = _lab.LAB_DIR / "mirror-server.log"
BIND = _lab.CONTROLLER_IP
PORT = _lab.MIRROR_PORT

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


class _Handler(SimpleHTTPRequestHandler):
    """The standard library's file server plus single byte ranges (RFC 9110 §14), so that
    ``curl -C -`` resumes as against a real web server: ``206`` + ``Content-Range`` for a
    satisfiable range, ``416`` + ``Content-Range: bytes */SIZE`` past the end, ``200`` (the
    whole file) for a header it does not understand (several ranges, garbage), as the RFC
    allows. ``rate`` (bytes/s, 0 = as fast as possible) slows the body down for fault tests.
    ``ranges=False`` is ``python3 -m http.server``, a likely air-gapped mirror: every Range
    header ignored (``200``, the whole file), no ``Accept-Ranges``."""

    access_log: Path = ACCESS_LOG
    protocol_version = "HTTP/1.0"
    rate: int = 0
    ranges: bool = True

    def send_response(self, code, message=None):
        self._p40_status = code
        super().send_response(code, message)

    def end_headers(self):
        if self.ranges and self._p40_status in (200, 206):
            self.send_header("Accept-Ranges", "bytes")
        super().end_headers()

    def _byte_range(self, size: int) -> tuple[int, int] | None | bool:
        """``(first, last)`` asked for, ``None`` for no usable Range, ``False`` if unsatisfiable."""
        match = _RANGE.fullmatch(self.headers.get("Range", "").strip())
        if not match or match.group(1) == match.group(2) == "":
            return None
        first, last = match.group(1), match.group(2)
        if first == "":  # suffix: the last N bytes
            n = int(last)
            return (max(size - n, 0), size - 1) if n > 0 and size > 0 else False
        lo = int(first)
        hi = min(int(last), size - 1) if last else size - 1
        if last and int(last) < lo:
            return None  # invalid: ignored, the whole file is sent
        return (lo, hi) if lo < size else False

    def send_head(self):
        self._p40_left = None
        if not self.ranges or "Range" not in self.headers:
            return super().send_head()
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            return super().send_head()
        f = open(path, "rb")  # noqa: SIM115 - handed to copyfile, closed by the base class
        size = os.fstat(f.fileno()).st_size
        wanted = self._byte_range(size)
        if wanted is None:
            f.close()
            return super().send_head()
        if wanted is False:
            f.close()
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        lo, hi = wanted
        f.seek(lo)
        self._p40_left = hi - lo + 1
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {lo}-{hi}/{size}")
        self.send_header("Content-Length", str(hi - lo + 1))
        self.send_header("Last-Modified", self.date_time_string(int(os.path.getmtime(path))))
        self.end_headers()
        return f

    def copyfile(self, source, outputfile):
        left = getattr(self, "_p40_left", None)
        chunk = max(1024, self.rate // 10) if self.rate else 64 * 1024
        while left is None or left > 0:
            buf = source.read(chunk if left is None else min(chunk, left))
            if not buf:
                break
            outputfile.write(buf)
            # counted as it goes: a client cut off mid-body was still sent these bytes
            self._p40_sent = getattr(self, "_p40_sent", 0) + len(buf)
            if left is not None:
                left -= len(buf)
            if self.rate:
                outputfile.flush()
                time.sleep(len(buf) / self.rate)

    def handle_one_request(self):
        self._p40_sent = 0
        self._p40_status = 0
        try:
            super().handle_one_request()
        finally:
            if getattr(self, "command", None):
                line = (
                    f"{time.time():.3f} {self.client_address[0]} {self.command} {self.path} "
                    f"{self._p40_status} {self._p40_sent}\n"
                )
                with open(self.access_log, "a") as f:
                    f.write(line)

    def log_message(self, format, *args):  # noqa: A002 - stdlib signature
        pass


def serve(
    mirror_dir: Path,
    bind: str = BIND,
    port: int = PORT,
    access_log: Path = ACCESS_LOG,
    rate: int = 0,
    ranges: bool = True,
):
    access_log.parent.mkdir(parents=True, exist_ok=True)
    attrs = {"access_log": access_log, "rate": rate, "ranges": ranges}
    handler = type("Handler", (_Handler,), attrs)

    def make(*a, **kw):
        return handler(*a, directory=str(mirror_dir), **kw)

    ThreadingHTTPServer.allow_reuse_address = True
    httpd = ThreadingHTTPServer((bind, port), make)
    signal.signal(signal.SIGTERM, lambda *_: (httpd.server_close(), sys.exit(0)))
    httpd.serve_forever()


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
