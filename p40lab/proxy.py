"""The lab's HTTP proxy: a small forward proxy (plain HTTP requests and ``CONNECT`` tunnels),
standard library only, one thread per connection, as a lab's squid would be to its hosts.

    python -m p40lab.proxy serve --bind 10.231.0.1 --port 3128 --allow 127.0.0.1:18111 \\
        --auth-file /var/lib/p40lab/proxy-auth --log /var/lib/p40lab/proxy-access.log

- Forwards only to the ``--allow`` targets (``HOST:PORT``); anything else is answered 403, so
  the proxy is never a way into the controller's other services.
- ``--auth-file``: one line ``USER:PASSWORD`` (kept in a 0600 file, never on the command
  line); a request without matching ``Proxy-Authorization: Basic`` is answered 407.
- The access log: one line per request ``TIME CLIENT METHOD TARGET STATUS BYTES USER``, the
  bytes sent back to the client; the password is never written anywhere.

With a mirror bound where the hosts cannot reach it (``127.0.0.1`` of the controller: each host's
``127.0.0.1`` is its own loopback), the mirror is reachable only through this proxy.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import http.client
import select
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from p40lab.util import spawn_server

__all__ = ["ProxyServer", "access_entries", "main", "start_proxy", "stop_proxy"]

# Hop-by-hop headers (RFC 9110 §7.6.1) and the proxy's own: never forwarded.
_HOP = {"connection", "keep-alive", "proxy-authorization", "proxy-authenticate",
        "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}  # fmt: skip
_CHUNK = 64 * 1024


class ProxyServer(ThreadingHTTPServer):
    """``allowed``: ``{"host:port", ...}`` the proxy forwards to; ``auth``: ``(user, password)``
    or None (no authentication); ``access_log``: the log file."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        allowed: set[str],
        access_log: Path,
        auth: tuple[str, str] | None = None,
    ) -> None:
        self.allowed = {a.lower() for a in allowed}
        self.access_log = Path(access_log)
        self.auth = auth
        self._log_lock = threading.Lock()
        super().__init__(address, _Handler)

    def log_access(self, client: str, method: str, target: str, status: int, sent: int,
                   user: str) -> None:  # fmt: skip
        line = f"{time.time():.3f} {client} {method} {target} {status} {sent} {user or '-'}\n"
        with self._log_lock, open(self.access_log, "a") as f:
            f.write(line)


class _Handler(BaseHTTPRequestHandler):
    server: ProxyServer
    protocol_version = "HTTP/1.0"  # one request per connection: the body ends at the close

    # -- helpers ---------------------------------------------------------------------------
    def _user(self) -> str | None:
        """The authenticated user ("" without auth), or None when the credentials are wrong."""
        if self.server.auth is None:
            return ""
        value = self.headers.get("Proxy-Authorization", "")
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(token.strip()).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return user if (user, password) == self.server.auth else None

    def _reply(self, status: int, text: str, extra: dict[str, str] | None = None) -> None:
        body = (text + "\n").encode()
        self.send_response(status)
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self._sent += len(body)

    def _admit(self, target: str) -> str | None:
        """The user when the request may go on; else answered (407/403) and None."""
        user = self._user()
        if user is None:
            self._status = 407
            self._reply(407, "proxy authentication required",
                        {"Proxy-Authenticate": 'Basic realm="p40lab"'})  # fmt: skip
            return None
        self._who = user
        if target.lower() not in self.server.allowed:
            self._status = 403
            self._reply(403, f"p40lab proxy: {target} is not an allowed target")
            return None
        return user

    def handle_one_request(self) -> None:
        self._status, self._sent, self._who, self._target = 0, 0, "", ""
        try:
            super().handle_one_request()
        finally:
            if getattr(self, "command", None):
                self.server.log_access(
                    self.client_address[0], self.command, self._target or self.path,
                    self._status, self._sent, self._who,
                )  # fmt: skip

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = code
        super().send_response(code, message)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    # -- CONNECT: a tunnel (https through the proxy) ------------------------------------------
    def do_CONNECT(self) -> None:  # noqa: N802 - http.server's naming
        self._target = self.path
        if self._admit(self.path) is None:
            return
        host, _, port = self.path.rpartition(":")
        try:
            upstream = socket.create_connection((host, int(port)), timeout=30)
        except (OSError, ValueError) as exc:
            self._reply(502, f"p40lab proxy: cannot reach {self.path}: {exc}")
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        self._pipe(upstream)

    def _pipe(self, upstream: socket.socket) -> None:
        client = self.connection
        try:
            while True:
                ready, _, _ = select.select([client, upstream], [], [], 60)
                if not ready:
                    return
                for sock in ready:
                    data = sock.recv(_CHUNK)
                    if not data:
                        return
                    (upstream if sock is client else client).sendall(data)
                    if sock is upstream:
                        self._sent += len(data)
        except OSError:
            return
        finally:
            upstream.close()

    # -- plain HTTP: absolute-URI requests ------------------------------------------------------
    def _forward(self) -> None:
        url = urlsplit(self.path)
        if url.scheme != "http" or not url.hostname:
            self._target = self.path
            self._reply(400, "p40lab proxy: expected an absolute http:// URL (or CONNECT)")
            return
        port = url.port or 80
        target = f"{url.hostname}:{port}"
        self._target = self.path
        if self._admit(target) is None:
            return
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        conn = http.client.HTTPConnection(url.hostname, port, timeout=60)
        try:
            conn.request(self.command, path, body=body, headers=headers)
            response = conn.getresponse()
        except OSError as exc:
            conn.close()
            self._reply(502, f"p40lab proxy: cannot reach {target}: {exc}")
            return
        try:
            self.send_response(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in _HOP:
                    self.send_header(key, value)
            self.send_header("Connection", "close")
            self.end_headers()
            while self.command != "HEAD":
                chunk = response.read(_CHUNK)
                if not chunk:
                    break
                self.wfile.write(chunk)
                self._sent += len(chunk)
        except OSError:
            pass  # the client went away: logged with the bytes sent so far
        finally:
            conn.close()

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_OPTIONS = _forward  # noqa: N815


def read_auth(path: Path | None) -> tuple[str, str] | None:
    """``USER:PASSWORD`` from the first line of ``path`` (None: no authentication)."""
    if path is None:
        return None
    user, sep, password = Path(path).read_text().splitlines()[0].partition(":")
    if not sep or not user:
        raise SystemExit(f"{path}: expected one line USER:PASSWORD")
    return user, password


def serve(bind: str, port: int, allowed: set[str], access_log: Path,
          auth_file: Path | None = None) -> None:  # fmt: skip
    access_log.parent.mkdir(parents=True, exist_ok=True)
    server = ProxyServer((bind, port), allowed, access_log, read_auth(auth_file))
    signal.signal(signal.SIGTERM, lambda *_: (server.server_close(), sys.exit(0)))
    server.serve_forever()


def start_proxy(
    bind: str,
    port: int,
    allowed: set[str],
    *,
    access_log: Path,
    pid_file: Path,
    auth_file: Path | None = None,
    timeout: float = 10.0,
) -> int:
    """Start ``python -m p40lab.proxy serve`` in the background, bound ONLY to ``bind``.
    Writes ``pid_file``; returns the PID once the port accepts connections."""
    stop_proxy(pid_file=pid_file)
    args = ["p40lab.proxy", "serve", "--bind", bind, "--port", str(port), "--log", str(access_log)]
    for target in sorted(allowed):
        args += ["--allow", target]
    if auth_file is not None:
        args += ["--auth-file", str(auth_file)]
    return spawn_server(
        args,
        bind=bind,
        port=port,
        pid_file=pid_file,
        server_log=access_log.with_name(access_log.stem + "-server.log"),
        what="proxy",
        stop=lambda: stop_proxy(pid_file=pid_file),
        timeout=timeout,
    )


def stop_proxy(*, pid_file: Path) -> bool:
    """Stop the proxy recorded in ``pid_file`` (by its PID). True when one was running."""
    from p40lab.httpd import stop_server  # the same PID-file protocol as the mirror's

    return stop_server(pid_file=pid_file)


def access_entries(access_log: Path) -> list[dict[str, Any]]:
    """The access log as dicts: time, client, method, target, status, bytes, user."""
    out = []
    try:
        lines = Path(access_log).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(" ")
        if len(parts) != 7:
            continue
        ts, client, method, target, status, sent, user = parts
        out.append({"time": float(ts), "client": client, "method": method, "target": target,
                    "status": int(status), "bytes": int(sent), "user": user})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m p40lab.proxy")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--bind", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--allow", action="append", default=[], help="HOST:PORT forwarded to")
    s.add_argument("--log", type=Path, required=True)
    s.add_argument("--auth-file", type=Path)
    args = ap.parse_args(argv)
    serve(args.bind, args.port, set(args.allow), args.log, args.auth_file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
