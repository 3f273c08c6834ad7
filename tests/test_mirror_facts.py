"""facts/mirror.py's UrlHead with what focal's curl 7.68 has (no ``%header{}`` write-out)."""

from __future__ import annotations

import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from p40fleet.facts.mirror import UrlHead

# What curl 7.68 prints for this fact's command (-D - headers, then the -w line) when a
# mirror redirects once: the first response's length is the redirect body's, not the file's.
CURL_768_REDIRECTED = [
    "HTTP/1.1 302 Found\r",
    "Location: /files/cuda.run\r",
    "Content-Length: 17\r",
    "\r",
    "HTTP/1.1 200 OK\r",
    "Server: nginx/1.18.0 (Ubuntu)\r",
    "content-length: 4234657\r",
    "Accept-Ranges: bytes\r",
    "\r",
    "status=200",
]


def command_text(url: str) -> str:
    return UrlHead().command(url).get_raw_value()


def test_command_uses_no_write_out_newer_than_curl_768():
    text = command_text("http://m/a.run")
    assert "%header{" not in text and "%{json}" not in text  # 7.84 / 7.70
    assert "-D -" in text


def test_size_is_the_last_responses_content_length_as_768_prints_it():
    answer = UrlHead().process(CURL_768_REDIRECTED)
    assert (answer.status, answer.size, answer.error) == (200, 4234657, "")
    assert answer.ok


def test_no_length_header_gives_no_size_and_a_curl_error_is_kept():
    answer = UrlHead().process(["HTTP/1.1 200 OK", "", "status=200"])
    assert (answer.status, answer.size) == (200, None)
    failed = UrlHead().process(
        ["curl: (7) Failed to connect to m port 80: Connection refused", "status=000"]
    )
    assert failed.status == 0 and failed.size is None and "Connection refused" in failed.error
    missing = UrlHead().process(["error=curl is not installed"])
    assert missing.status == 0 and missing.error == "curl is not installed"


class _Handler(BaseHTTPRequestHandler):
    def do_HEAD(self):  # noqa: N802 (http.server's name)
        if self.path == "/old":
            self.send_response(301)
            self.send_header("Location", "/new")
            self.send_header("Content-Length", "5")
        else:
            self.send_response(200)
            self.send_header("Content-Length", "123456")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture()
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_the_command_against_a_real_server_through_a_redirect(server):
    proc = subprocess.run(
        ["sh", "-c", command_text(f"{server}/old")], capture_output=True, text=True, timeout=30
    )
    answer = UrlHead().process(proc.stdout.splitlines())
    assert (answer.status, answer.size, answer.error) == (200, 123456, "")
