"""One verdict everywhere (issue 28): ``deploy/full.py``'s closing verification, plain
``pyinfra … deploy/verify.py`` and ``python -m p40fleet.verify`` give a host the same verdict,
reason and fix; ``python -m p40fleet.deploy`` and ``p40fleet.verify`` the same exit status; the
report is written whatever happens (every host down included); a host whose key changed is its
own reason, naming ``python -m p40fleet.rekey``.

All offline: ``@local`` is the refused host (this machine has no NVIDIA GPU and is not Ubuntu,
as the lab's GPU-less host), a closed local port the unreachable one, and a paramiko server on
a local port presenting another key than known_hosts records the reinstalled one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import paramiko
import pytest

from p40fleet import host_key, report

REPO = Path(__file__).resolve().parent.parent
STRICT = "'ssh_strict_host_key_checking': 'yes'"


def _env(report_path: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != report.REPORT_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    if report_path is not None:
        env[report.REPORT_ENV] = str(report_path)
    return env


def run(args: list[str], report_path: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, env=_env(report_path),
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def three_entry_points(tmp_path: Path, inventory: Path) -> dict[str, tuple[int, dict]]:
    """``{entry point: (exit status, the report's host entries)}``."""
    out = {}
    cli = tmp_path / "cli.json"
    junit = tmp_path / "cli.xml"
    proc = run(["p40fleet.verify", str(inventory), "-q", "--json", str(cli), "--junit", str(junit)])
    assert cli.is_file() and junit.is_file(), proc.stdout + proc.stderr
    ET.parse(junit)  # well-formed JUnit
    out["p40fleet.verify"] = (proc.returncode, json.loads(cli.read_text())["hosts"])
    for deploy in ("deploy/verify.py", "deploy/full.py"):
        path = tmp_path / (Path(deploy).stem + ".json")
        proc = run(["pyinfra", "-y", str(inventory), deploy], path)
        assert path.is_file(), proc.stdout + proc.stderr
        out[f"pyinfra {deploy}"] = (proc.returncode, json.loads(path.read_text())["hosts"])
    proc = run(["p40fleet.deploy", str(inventory), "deploy/full.py", "-y"])
    out["p40fleet.deploy deploy/full.py"] = (proc.returncode, {})
    return out


def checks(entry: dict) -> dict[str, tuple[str, str, str]]:
    return {c["name"]: (c["status"], c["detail"], c["remedy"]) for c in entry["checks"]}


def test_a_refused_host_has_one_verdict_reason_and_exit_status(tmp_path):
    lock = tmp_path / "run.lock"
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"hosts = [('@local', {{'p40fleet_run_lock': {str(lock)!r}}})]\n")
    seen = three_entry_points(tmp_path, inventory)
    codes = {name: code for name, (code, _) in seen.items()}
    assert codes["p40fleet.verify"] == codes["p40fleet.deploy deploy/full.py"] == 3, seen
    entries = {name: hosts["@local"] for name, (_, hosts) in seen.items() if hosts}
    assert {e["verdict"] for e in entries.values()} == {"REFUSED"}, entries
    outside = {name: {k: v for k, v in checks(e).items() if k in ("GPU check", "OS check")}
               for name, e in entries.items()}  # fmt: skip
    first = outside["p40fleet.verify"]
    assert (
        set(first) == {"GPU check", "OS check"} and "no NVIDIA GPU found" in first["GPU check"][1]
    )
    assert all(found == first for found in outside.values()), outside  # same reason and fix
    assert "provisioning" not in checks(entries["pyinfra deploy/full.py"])
    assert not lock.exists()  # released


def test_an_unreachable_host_has_one_verdict_and_reports_are_written_with_every_host_down(
    tmp_path,
):
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        f"hosts = [('deadhost', {{'ssh_hostname': '127.0.0.1', 'ssh_port': 1, {STRICT}}})]\n"
    )
    seen = three_entry_points(tmp_path, inventory)
    assert {code for code, _ in seen.values()} == {1}, seen
    entries = [hosts["deadhost"] for _, hosts in seen.values() if hosts]
    assert len(entries) == 3 and {e["verdict"] for e in entries} == {"UNREACHABLE"}, entries
    assert all(checks(e) == checks(entries[0]) for e in entries), entries
    (status, detail, fix) = checks(entries[0])["connect"]
    assert status == "FAIL" and "Could not connect" in detail, detail  # pyinfra's own cause
    assert "check the host is up" in fix


def test_an_unchecked_key_is_refused_alike_before_any_connection(tmp_path):
    inventory = tmp_path / "inventory.py"
    inventory.write_text("hosts = [('deadhost', {'ssh_hostname': '127.0.0.1', 'ssh_port': 1})]\n")
    seen = three_entry_points(tmp_path, inventory)
    entries = [hosts["deadhost"] for _, hosts in seen.values() if hosts]
    assert {e["verdict"] for e in entries} == {"REFUSED"}, entries
    assert all(checks(e) == checks(entries[0]) for e in entries), entries
    (_, detail, fix) = checks(entries[0])["ssh host key"]
    assert "ssh_strict_host_key_checking" in detail and "python -m p40fleet.rekey" in fix
    assert seen["p40fleet.verify"][0] == seen["p40fleet.deploy deploy/full.py"][0] == 3


# --- a host whose key changed (reinstalled): its own reason, naming p40fleet.rekey -----------


class _KexOnly(paramiko.ServerInterface):
    def get_allowed_auths(self, username):  # noqa: ARG002 - paramiko's signature
        return "publickey"


@pytest.fixture
def reinstalled_host(tmp_path):
    """A local SSH server whose key is not the one the known_hosts file records for it."""
    server_key = paramiko.RSAKey.generate(2048)
    recorded = paramiko.RSAKey.generate(2048)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} ssh-rsa {recorded.get_base64()}\n")

    transports: list[paramiko.Transport] = []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transports.append(transport)
            transport.add_server_key(server_key)
            try:
                transport.start_server(server=_KexOnly())
            except (paramiko.SSHException, EOFError, OSError):
                transport.close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    yield port, known
    # every thread ends here: a thread left in accept() or a live transport makes a later
    # `import pyinfra_cli` (gevent's patch_all) fail in this process ("cannot release
    # un-acquired lock", tests/test_sshguard.py after this file)
    try:
        listener.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    listener.close()
    server.join(10)
    for transport in transports:  # ends its thread (under gevent, once the hub runs it)
        transport.close()
        transport.join(10)
    assert not server.is_alive()


def test_a_changed_host_key_is_its_own_reason_naming_rekey(tmp_path, reinstalled_host):
    port, known = reinstalled_host
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        f"hosts = [('lab9', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {port}, {STRICT}, "
        f"'ssh_known_hosts_file': {str(known)!r}, 'ssh_user': 'nobody'}})]\n"
    )
    seen = three_entry_points(tmp_path, inventory)
    assert {code for code, _ in seen.values()} == {1}, seen
    entries = [hosts["lab9"] for _, hosts in seen.values() if hosts]
    assert {e["verdict"] for e in entries} == {"UNREACHABLE"}, entries
    assert all(checks(e) == checks(entries[0]) for e in entries), entries
    (status, detail, fix) = checks(entries[0])["ssh host key"]
    assert status == "FAIL" and "does not match" in detail, detail
    assert "python -m p40fleet.rekey INVENTORY lab9 --expect SHA256:" in fix, fix
    assert "check the host is up" not in fix


# --- the entries themselves ------------------------------------------------------------------


def test_connect_entry_words():
    assert report.connect_entry("h") == report.unreachable_entry()
    changed = report.connect_entry(
        "h", "error", "SSH host key error (Host key for h does not match.)"
    )
    assert changed["verdict"] == "UNREACHABLE"
    assert changed["checks"][0]["name"] == "ssh host key"
    assert "python -m p40fleet.rekey INVENTORY h" in changed["checks"][0]["remedy"]
    unknown = report.connect_entry(
        "h", "error", "SSH error (StrictPolicy: No host key for h found in known_hosts)"
    )
    assert unknown["checks"][0]["name"] == "ssh host key"
    down = report.connect_entry("h", "error", "Could not connect ([Errno 111] Connection refused)")
    assert down["checks"][0]["name"] == "connect"
    assert "Connection refused" in down["checks"][0]["detail"]
    refused = report.connect_entry("h", host_key.REFUSED, "host h: key not checked")
    assert refused["verdict"] == "REFUSED"
    assert refused["checks"][0]["detail"] == "key not checked"
    assert refused["checks"][0]["remedy"] == host_key.HOST_KEY_REMEDY


def test_a_host_the_deploy_reboots_does_not_end_the_runs_report(monkeypatch):
    """pyinfra's reboot disconnects the host mid-run (``host_disconnect``): that is not the end
    of the run, only every activated host failed or refused is ("No hosts remaining!")."""
    from types import SimpleNamespace

    from p40fleet.operations.run import verify as run_verify
    from p40fleet.run_record import run_record

    class Host(SimpleNamespace):
        __hash__ = object.__hash__

    class State(Host):  # hashable, as pyinfra's: it keys the run's record
        pass

    written = []
    monkeypatch.setattr(run_verify, "finish", lambda entries: written.append(entries))
    lab1, lab2 = Host(name="lab1"), Host(name="lab2")
    state = State(is_executing=True, activated_hosts={lab1, lab2}, failed_hosts=set(),
                  inventory=[lab1, lab2])  # fmt: skip
    run_record(state).verify_specs.update({"lab1": None, "lab2": None})
    callback = run_verify._VerifyAfterLastOperation.host_disconnect
    callback(state, lab1)  # lab1 reboots; lab2 goes on
    assert written == [] and not run_record(state).verify_finished
    state.failed_hosts = {lab1, lab2}  # every host failed or was refused: the run ends here
    monkeypatch.setattr(run_verify, "_unprobed_entry", lambda target, specs: {"h": target.name})
    callback(state, lab1)
    assert written == [{"lab1": {"h": "lab1"}, "lab2": {"h": "lab2"}}]
