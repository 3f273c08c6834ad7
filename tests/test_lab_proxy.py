"""p40lab/proxy.py on this machine (no lab): forwards plain HTTP and CONNECT to the allowed
targets only, asks for its credentials, logs every request and never the password."""

from __future__ import annotations

import base64
import functools
import socket
import threading
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer

import pytest

from p40lab import httpd
from p40lab.proxy import ProxyServer, access_entries

SECRET = "Zq7-S3cr3t-pw9"


@pytest.fixture
def servers(tmp_path):
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "a.txt").write_bytes(b"0123456789" * 1000)
    # the lab mirror's own handler (byte ranges, as curl -C - needs)
    handler = type("H", (httpd._Handler,), {"access_log": tmp_path / "mirror.log"})
    upstream = ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=str(tmp_path / "www"))
    )
    up = f"127.0.0.1:{upstream.server_address[1]}"
    log = tmp_path / "proxy.log"
    proxy = ProxyServer(("127.0.0.1", 0), {up}, log, ("lab", SECRET))
    for server in (upstream, proxy):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"up": up, "proxy": f"127.0.0.1:{proxy.server_address[1]}", "log": log}
    for server in (upstream, proxy):
        server.shutdown()
        server.server_close()


def _get(proxy_url: str, url: str, headers: dict | None = None) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url}))
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_get_through_the_proxy_with_credentials_and_ranges(servers):
    url = f"http://{servers['up']}/a.txt"
    status, body = _get(f"http://lab:{SECRET}@{servers['proxy']}", url)
    assert status == 200 and body == b"0123456789" * 1000
    status, body = _get(f"http://lab:{SECRET}@{servers['proxy']}", url, {"Range": "bytes=5-9"})
    assert (status, body) == (206, b"56789")  # Range forwarded, 206 passed back
    entries = access_entries(servers["log"])
    assert [(e["method"], e["target"], e["status"], e["user"]) for e in entries[:1]] == [
        ("GET", url, 200, "lab")
    ]
    assert entries[0]["bytes"] == 10000
    assert SECRET not in servers["log"].read_text()


def test_wrong_or_no_credentials_get_407(servers):
    url = f"http://{servers['up']}/a.txt"
    assert _get(f"http://{servers['proxy']}", url)[0] == 407
    assert _get(f"http://lab:wrong@{servers['proxy']}", url)[0] == 407
    assert [e["status"] for e in access_entries(servers["log"])] == [407, 407]
    assert "wrong" not in servers["log"].read_text()


def test_only_allowed_targets(servers):
    status, body = _get(f"http://lab:{SECRET}@{servers['proxy']}", "http://127.0.0.1:9/x")
    assert status == 403 and b"not an allowed target" in body


def test_connect_tunnels_to_an_allowed_target_only(servers):
    host, port = servers["proxy"].split(":")
    token = base64.b64encode(f"lab:{SECRET}".encode()).decode()

    def connect(target: str) -> bytes:
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(f"CONNECT {target} HTTP/1.1\r\nProxy-Authorization: Basic {token}\r\n\r\n"
                      .encode())  # fmt: skip
            head = s.recv(4096)
            if b" 200 " not in head.split(b"\r\n")[0]:
                return head
            s.sendall(b"GET /a.txt HTTP/1.0\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            return head + data

    through = connect(servers["up"])
    assert through.endswith(b"0123456789" * 1000)
    assert b" 403 " in connect("127.0.0.1:9").split(b"\r\n")[0]
    methods = [(e["method"], e["status"]) for e in access_entries(servers["log"])]
    assert methods == [("CONNECT", 200), ("CONNECT", 403)]
