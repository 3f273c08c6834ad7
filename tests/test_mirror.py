"""The mirror on a host: facts/mirror.py and operations/mirror.py (facts in, commands out,
tests/opharness.py). The mirror builder, ``p40fleet.mirror``, is tests/test_mirror_*.py."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from p40fleet.facts.mirror import MIRROR_LIST, AptSources, AptSourceState, UrlHead
from p40fleet.operations import mirror
from tests.opharness import at, run_op
from tests.test_apt_lock import apt_commands

URL = "http://10.231.0.1:8111/apt"
LINE = f"deb [trusted=yes] {URL} ./"
LIST_TEXT = f"# p40fleet: header\n{LINE}\n"
OTHERS = ("/etc/apt/sources.list", "/etc/apt/sources.list.d/debian.sources")


def _mirror(state: AptSourceState, **kw):
    args = {"url": URL, "suite": "./", "trusted": True} | kw
    key_path = mirror.key_dest(args["key_file"]) if args.get("key_file") else None
    return run_op(mirror.mirror, facts={at(AptSources, key_path=key_path): state}, **args)


def test_source_line_signed_trusted_or_plain():
    assert mirror.source_line(URL, "./", trusted=True) == LINE
    signed = mirror.source_line("http://m/ubuntu", "focal", ["main", "universe"], "/k/m.asc")
    assert (
        signed
        == "deb [signed-by=/etc/apt/keyrings/p40fleet-mirror.asc] http://m/ubuntu focal main "
        "universe"
    )
    # neither: apt checks signatures against its own keyrings (never trusted=yes by default)
    assert mirror.source_line("http://m/u", "focal", ["main"]) == "deb http://m/u focal main"


def test_absent_source_is_written_then_apt_updated():
    result = _mirror(AptSourceState())
    assert result.commands[:2] == [f"upload {MIRROR_LIST}", f"chmod 644 {MIRROR_LIST}"]
    assert result.uploads[MIRROR_LIST].splitlines()[1] == LINE
    assert result.commands[-1] == "function _stream"  # waits for the dpkg lock
    assert apt_commands(result) == ['apt-get update -q -o DPkg::Lock::Timeout="$p40_rest"']
    script = result.functions[-1].args[0].get_raw_value()
    assert "apt-get update failed with the mirror source" in script


def test_second_run_changes_nothing():
    first = _mirror(AptSourceState())
    again = _mirror(AptSourceState(mirror_list=first.uploads[MIRROR_LIST]))
    assert not again.changed and URL in again.noops[0]


def test_extra_suites_one_line_each():
    suites = {"suite": "focal", "components": ["main"], "extra_suites": ["focal-updates"]}
    text = _mirror(AptSourceState(), **suites).uploads[MIRROR_LIST]
    assert text.splitlines()[1:] == [
        f"deb [trusted=yes] {URL} focal main",
        f"deb [trusted=yes] {URL} focal-updates main",
    ]
    assert not _mirror(AptSourceState(mirror_list=text), **suites).changed


def test_edited_or_removed_source_restored():
    for state in (AptSourceState(mirror_list="deb http://elsewhere/ ./\n"), AptSourceState()):
        result = _mirror(state)
        assert f"upload {MIRROR_LIST}" in result.commands
        assert apt_commands(result)[-1].startswith("apt-get update")


def test_air_gapped_moves_distribution_sources_aside_keeping_their_layout():
    """N12: each file goes aside under its own path, so where it came from is kept."""
    text = _mirror(AptSourceState()).uploads[MIRROR_LIST]
    result = _mirror(AptSourceState(mirror_list=text, others=OTHERS), air_gapped=True)
    assert result.commands == [
        "mkdir -p /etc/apt/p40fleet-aside /etc/apt/p40fleet-aside/sources.list.d",
        "mv --backup=numbered -T /etc/apt/sources.list /etc/apt/p40fleet-aside/sources.list",
        "mv --backup=numbered -T /etc/apt/sources.list.d/debian.sources "
        "/etc/apt/p40fleet-aside/sources.list.d/debian.sources",
        result.commands[-1],
    ]
    assert apt_commands(result)[-1].startswith("apt-get update")
    assert any("air-gapped" in line for line in result.logs)


def test_not_air_gapped_any_more_moves_them_back():
    """N12: air_gapped turned off: what the fact sees aside goes back where it came from (a
    bare name of the earlier flat layout came from sources.list.d); a place taken again keeps
    its file and the aside copy stays, with a note; nothing aside: nothing to do."""
    text = _mirror(AptSourceState()).uploads[MIRROR_LIST]
    aside = (("sources.list", True), ("sources.list.d/cuda.list", True), ("old.list", True),
             ("sources.list.d/debian.sources", False))  # fmt: skip
    result = _mirror(AptSourceState(mirror_list=text, aside=aside))
    assert result.commands == [
        "mkdir -p /etc/apt /etc/apt/sources.list.d",
        "mv -T /etc/apt/p40fleet-aside/sources.list /etc/apt/sources.list",
        "mv -T /etc/apt/p40fleet-aside/sources.list.d/cuda.list /etc/apt/sources.list.d/cuda.list",
        "mv -T /etc/apt/p40fleet-aside/old.list /etc/apt/sources.list.d/old.list",
        result.commands[-1],
    ]
    assert apt_commands(result)[-1].startswith("apt-get update")
    assert any("stays aside" in line and "debian.sources" in line for line in result.logs)
    taken = _mirror(AptSourceState(mirror_list=text, aside=aside[3:]))
    assert not taken.changed
    # still air-gapped: what is aside stays there
    assert not _mirror(AptSourceState(mirror_list=text, aside=aside), air_gapped=True).changed


def test_aside_and_back_on_a_fake_etc_apt_round_trip(tmp_path):
    """N12 end to end in a temp /etc/apt: fact -> commands -> shell, both ways; the second run
    of each changes nothing and the tree comes back as it was."""
    apt = tmp_path / "etc/apt"
    (apt / "sources.list.d").mkdir(parents=True)
    original = {
        "sources.list": "deb http://deb.debian.org/debian bookworm main\n",
        "sources.list.d/debian.sources": "Types: deb\nURIs: http://x\n",
        "sources.list.d/cuda.list": "deb http://cuda/ ./\n",
    }
    for rel, body in original.items():
        (apt / rel).write_text(body)
    (apt / "sources.list.d/p40fleet-mirror.list").write_text(
        _mirror(AptSourceState()).uploads[MIRROR_LIST]
    )

    def fact() -> AptSourceState:
        command = str(AptSources().command()).replace("/etc/apt", str(apt))
        out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, check=True)
        return AptSources().process(out.stdout.replace(str(apt), "/etc/apt").splitlines())

    def deploy(air_gapped: bool) -> bool:
        result = _mirror(fact(), air_gapped=air_gapped)
        for command in result.commands:
            if command.startswith(("mkdir", "mv")):
                subprocess.run(["/bin/sh", "-c", command.replace("/etc/apt", str(apt))], check=True)
        return result.changed

    def tree() -> dict[str, str]:
        return {str(p.relative_to(apt)): p.read_text() for p in apt.rglob("*") if p.is_file()
                and p.name != "p40fleet-mirror.list"}  # fmt: skip

    assert deploy(True)
    assert tree() == {f"p40fleet-aside/{rel}": body for rel, body in original.items()}
    assert not deploy(True)
    assert deploy(False)
    assert tree() == original
    assert not deploy(False)


def test_not_air_gapped_keeps_distribution_sources():
    text = _mirror(AptSourceState()).uploads[MIRROR_LIST]
    result = _mirror(AptSourceState(mirror_list=text, others=OTHERS))
    assert not result.changed


def test_signed_by_key_shipped_once(tmp_path):
    key = tmp_path / "mirror.gpg"
    key.write_bytes(b"\x99binary key")
    dest = "/etc/apt/keyrings/p40fleet-mirror.gpg"
    args = {"suite": "focal", "components": ["main"], "key_file": str(key), "trusted": False}
    result = _mirror(AptSourceState(), **args)
    assert result.commands[:3] == ["mkdir -p -m 755 /etc/apt/keyrings", f"upload {dest}",
                                   f"chmod 644 {dest}"]  # fmt: skip
    assert f"deb [signed-by={dest}] {URL} focal main" in result.uploads[MIRROR_LIST]
    text = result.uploads[MIRROR_LIST]
    sha = hashlib.sha256(key.read_bytes()).hexdigest()
    again = _mirror(AptSourceState(mirror_list=text, key_sha256=sha), **args)
    assert not again.changed
    # a new key on the controller (the mirror re-keyed): shipped again, apt updated
    changed = _mirror(AptSourceState(mirror_list=text, key_sha256="0" * 64), **args)
    assert f"upload {dest}" in changed.commands and apt_commands(changed)[-1].startswith("apt-get")


def test_fact_reads_list_key_and_other_sources(tmp_path):
    """The fact's shell, run against a fake /etc/apt (paths rewritten into tmp)."""
    apt = tmp_path / "etc/apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list").write_text("deb http://deb.debian.org/debian bookworm main\n")
    (apt / "sources.list.d/debian.sources").write_text("Types: deb\nURIs: http://x\n")
    (apt / "sources.list.d/comments.list").write_text("# deb http://old ./\n")
    (apt / "sources.list.d/p40fleet-mirror.list").write_text(LIST_TEXT)
    key = tmp_path / "k.gpg"
    key.write_bytes(b"key")
    command = str(AptSources().command(key_path=str(key))).replace("/etc/apt", str(apt))
    out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, check=True)
    state = AptSources().process(out.stdout.splitlines())
    assert state.mirror_list == LIST_TEXT
    assert state.key_sha256 == hashlib.sha256(b"key").hexdigest()
    assert state.others == (str(apt / "sources.list"), str(apt / "sources.list.d/debian.sources"))
    (apt / "sources.list.d/p40fleet-mirror.list").unlink()
    command = str(AptSources().command()).replace("/etc/apt", str(apt))
    out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, check=True)
    assert AptSources().process(out.stdout.splitlines()) == AptSourceState(others=state.others)
    # N12: what is aside, and whether its origin is free (a bare name: from sources.list.d)
    aside = apt / "p40fleet-aside"
    (aside / "sources.list.d").mkdir(parents=True)
    (aside / "sources.list.d/cuda.list").write_text("deb http://cuda/ ./\n")
    (aside / "sources.list").write_text("deb http://deb.debian.org/debian bookworm main\n")
    (aside / "old.sources").write_text("Types: deb\n")
    (aside / "sources.list.~1~").write_text("a numbered backup: never restored\n")
    out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, check=True)
    assert AptSources().process(out.stdout.splitlines()).aside == (
        ("sources.list", False), ("old.sources", True), ("sources.list.d/cuda.list", True),
    )  # fmt: skip


# -- the signed-by line with real apt: checked, never trusted ---------------------------------

needs_apt_gpg = pytest.mark.skipif(
    not (shutil.which("apt-get") and shutil.which("gpg")), reason="needs apt-get and gpg"
)


def _signing_key(home: Path, name: str) -> Path:
    """A fresh ed25519 signing key in GNUPGHOME ``home``; returns its exported keyring."""
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    subprocess.run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key",
                    f"{name} <{name}@localhost>", "ed25519", "sign", "never"],
                   check=True, capture_output=True, env=env)  # fmt: skip
    keyring = home.parent / f"{name}.gpg"
    keyring.write_bytes(subprocess.run(["gpg", "--export"], check=True, capture_output=True,
                                       env=env).stdout)  # fmt: skip
    return keyring


def _apt_update(tmp: Path, line: str) -> subprocess.CompletedProcess:
    """``apt-get update`` with only ``line`` as its source, all state under ``tmp``."""
    for d in ("parts", "lists/partial", "cache/archives/partial"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    (tmp / "sources.list").write_text(line + "\n")
    options = {"Dir::Etc::SourceList": tmp / "sources.list", "Dir::Etc::SourceParts": tmp / "parts",
               "Dir::State::Lists": tmp / "lists", "Dir::Cache": tmp / "cache",
               "Debug::NoLocking": "1"}  # fmt: skip
    argv = ["apt-get", "update"] + [a for k, v in options.items() for a in ("-o", f"{k}={v}")]
    return subprocess.run(argv, capture_output=True, text=True)


@needs_apt_gpg
def test_signed_by_line_makes_apt_check_the_mirror_key(tmp_path, request):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "Packages").write_text("")
    subprocess.run(["gzip", "-k9n", str(repo / "Packages")], check=True)
    sums = "".join(
        f" {hashlib.sha256((repo / f).read_bytes()).hexdigest()} {(repo / f).stat().st_size} {f}\n"
        for f in ("Packages", "Packages.gz")
    )
    (repo / "Release").write_text(f"Origin: t\nDate: {formatdate(usegmt=True)}\nSHA256:\n{sums}")
    key = _signing_key(tmp_path / "gnupg", "mirror")
    other = _signing_key(tmp_path / "gnupg2", "other")
    for home in ("gnupg", "gnupg2"):  # gpg started an agent per home: stop it with the test
        request.addfinalizer(
            lambda home=home: subprocess.run(["gpgconf", "--kill", "gpg-agent"], check=False,
                                             env={**os.environ, "GNUPGHOME": str(tmp_path / home)})
        )  # fmt: skip
    subprocess.run(["gpg", "--batch", "--yes", "--clearsign", "-o", str(repo / "InRelease"),
                    str(repo / "Release")], check=True, capture_output=True,
                   env={**os.environ, "GNUPGHOME": str(tmp_path / "gnupg")})  # fmt: skip

    def line(keyring: Path | None, trusted: bool = False) -> str:
        # the operation's line, with the host's key path pointed at this test's keyring
        text = mirror.source_line(f"file://{repo}", "./", (), "/k/m.gpg" if keyring else None,
                                      trusted)  # fmt: skip
        return text.replace(mirror.key_dest("/k/m.gpg"), str(keyring))

    ok = _apt_update(tmp_path / "ok", line(key))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    for bad in (line(other), line(None)):  # the wrong key, or no key and not trusted: refused
        refused = _apt_update(tmp_path / f"bad{len(bad)}", bad)
        assert refused.returncode == 100, refused.stdout + refused.stderr
        assert "NO_PUBKEY" in refused.stderr or "not signed" in refused.stderr, refused.stderr


# -- UrlHead with what focal's curl 7.68 has (no ``%header{}`` write-out) --------------------

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
