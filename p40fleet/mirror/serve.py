"""The mirror's HTTP server: the standard library's file server with single byte ranges (so
``curl -C -`` resumes), content types for what a mirror holds, an optional access log.

``python -m p40fleet.mirror serve DIR --bind ADDR:PORT`` for a small lab; a real lab's web
server (nginx, README's snippet) does the same with more clients at once.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")

#: What a mirror serves beyond the standard library's table (pip and curl ignore the type of a
#: wheel; browsers and proxies do not).
CONTENT_TYPES = {
    ".whl": "application/zip",
    ".run": "application/octet-stream",
    ".sh": "application/octet-stream",
    ".xz": "application/x-xz",
    ".zst": "application/zstd",
    ".deb": "application/vnd.debian.binary-package",
    ".json": "application/json",
}


class RangeFileHandler(SimpleHTTPRequestHandler):
    """The standard library's file server plus single byte ranges (RFC 9110 §14), so that
    ``curl -C -`` resumes as against a real web server: ``206`` + ``Content-Range`` for a
    satisfiable range, ``416`` + ``Content-Range: bytes */SIZE`` past the end, ``200`` (the
    whole file) for a header it does not understand (several ranges, garbage), as the RFC
    allows. ``rate`` (bytes/s, 0 = as fast as possible) slows the body down for fault tests.
    ``ranges=False`` is ``python3 -m http.server``, a likely air-gapped mirror: every Range
    header ignored (``200``, the whole file), no ``Accept-Ranges``."""

    access_log: Path | None = None  # one line per request: time client method path status bytes
    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, **CONTENT_TYPES}
    protocol_version = "HTTP/1.0"
    rate: int = 0
    ranges: bool = True
    # Top-level dirs never served: the apt repository's signing key (DIR/keys) stays private.
    hidden: tuple[str, ...] = ("keys",)

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
        # as the file server maps the path (., .., //, %2e decoded): its first part under DIR
        rel = os.path.relpath(self.translate_path(self.path), self.directory)
        if rel.split(os.sep, 1)[0] in self.hidden:
            self.send_error(404, "File not found")
            return None
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
                if self.access_log is not None:
                    with open(self.access_log, "a") as f:
                        f.write(line)

    def log_message(self, format, *args):  # noqa: A002 - stdlib signature
        pass


def serve(
    mirror_dir: Path,
    bind: str,
    port: int,
    access_log: Path | None = None,
    rate: int = 0,
    ranges: bool = True,
    handler: type[RangeFileHandler] = RangeFileHandler,
) -> None:
    """Serve ``mirror_dir`` on ``bind:port`` until SIGTERM (or Ctrl-C)."""
    if access_log is not None:
        access_log.parent.mkdir(parents=True, exist_ok=True)
    attrs = {"access_log": access_log, "rate": rate, "ranges": ranges}
    cls = type("Handler", (handler,), attrs)

    def make(*a, **kw):
        return cls(*a, directory=str(mirror_dir), **kw)

    ThreadingHTTPServer.allow_reuse_address = True
    httpd = ThreadingHTTPServer((bind, port), make)
    signal.signal(signal.SIGTERM, lambda *_: (httpd.server_close(), sys.exit(0)))
    httpd.serve_forever()
