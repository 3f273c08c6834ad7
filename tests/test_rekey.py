"""p40fleet.rekey against a paramiko sshd stub on 127.0.0.1 and a temp known_hosts."""

from __future__ import annotations

import base64
import io
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from paramiko.hostkeys import HostKeys

from p40fleet.cli import rekey

REPO = Path(__file__).resolve().parents[1]


class _StubSshd:
    """Answers the SSH key exchange with ``key`` (no auth: a client that only wants the key)."""

    def __init__(self, key: paramiko.PKey) -> None:
        self.key = key
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                return
            t = paramiko.Transport(conn)
            t.add_server_key(self.key)
            try:
                t.start_server(server=paramiko.ServerInterface())
                t.join(5)  # the client closes after the key exchange
            except (paramiko.SSHException, EOFError, OSError):
                pass
            finally:
                t.close()

    def close(self) -> None:
        """Stop the accept loop for real (a thread left in accept() outlives the test)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture(scope="module")
def keys() -> dict[str, paramiko.PKey]:
    return {"old": paramiko.ECDSAKey.generate(), "new": paramiko.ECDSAKey.generate()}


@pytest.fixture
def sshd(keys) -> Iterator[_StubSshd]:
    server = _StubSshd(keys["new"])
    yield server
    server.close()


def _line(names: str, key: paramiko.PKey) -> str:
    return f"{names} {key.get_name()} {key.get_base64()}\n"


@pytest.fixture
def setup(tmp_path, sshd, keys):
    """A known_hosts with the old key for the stub's ``[127.0.0.1]:port`` among other hosts."""
    other = paramiko.ECDSAKey.generate()
    name = f"[127.0.0.1]:{sshd.port}"
    known = tmp_path / "known_hosts"
    lines = ["# the lab\n", _line("10.0.0.5,other", other), _line(name, keys["old"]),
             _line("10.0.0.6", other)]  # fmt: skip
    known.write_text("".join(lines))
    known.chmod(0o600)
    target = rekey.Target("web1", "127.0.0.1", sshd.port, known)
    return target, known, lines


def _run(target, **kw) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = rekey.rekey(target, out=out, err=err, **kw)
    return code, out.getvalue(), err.getvalue()


def test_fingerprint_is_openssh_sha256_form(tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")],
                   check=True)  # fmt: skip
    ssh_keygen = subprocess.run(
        ["ssh-keygen", "-lf", str(tmp_path / "k.pub")], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    blob = (tmp_path / "k.pub").read_text().split()[1]
    key = paramiko.Ed25519Key(data=base64.b64decode(blob))
    assert rekey.fingerprint(key) == ssh_keygen
    assert rekey.normalize_fingerprint(ssh_keygen + "=") == ssh_keygen
    with pytest.raises(rekey.RekeyError, match="not a SHA256 fingerprint"):
        rekey.normalize_fingerprint("MD5:aa:bb")


def test_matching_expect_replaces_only_that_entry_keeping_mode(setup, keys):
    target, known, lines = setup
    code, out, _err = _run(target, expect=rekey.fingerprint(keys["new"]))
    assert code == 0, out
    assert f"old: {keys['old'].get_name()} {rekey.fingerprint(keys['old'])}" in out
    assert f"new: {keys['new'].get_name()} {rekey.fingerprint(keys['new'])}" in out
    after = known.read_text().splitlines(keepends=True)
    assert after == [lines[0], lines[1], _line(target.entry_name, keys["new"]), lines[3]]
    assert known.stat().st_mode & 0o777 == 0o600
    assert not [p for p in known.parent.iterdir() if p.name != "known_hosts"]  # no temp left
    # paramiko (pyinfra's client) now accepts the host
    assert HostKeys(str(known)).lookup(target.entry_name)[keys["new"].get_name()] == keys["new"]
    # a second run changes nothing
    code, out, _err = _run(target, expect=rekey.fingerprint(keys["new"]))
    assert code == 0 and "already this key" in out
    assert known.read_text().splitlines(keepends=True) == after


def test_mismatching_expect_exits_2_and_changes_nothing(setup, keys):
    target, known, _lines = setup
    before = known.read_bytes()
    code, _out, err = _run(target, expect=rekey.fingerprint(keys["old"]))
    assert code == rekey.EXIT_MISMATCH == 2
    assert "REFUSED" in err and rekey.fingerprint(keys["new"]) in err
    assert known.read_bytes() == before


def test_no_confirmation_changes_nothing(setup):
    target, known, _lines = setup
    before = known.read_bytes()
    asked = []
    code, _out, err = _run(target, ask=lambda q: asked.append(q) or False)
    assert code == 1 and "not confirmed" in err and len(asked) == 1
    assert known.read_bytes() == before
    # a non-interactive run without --expect or --yes is not a confirmation either
    code, _out, err = _run(target)
    assert code == 1 and known.read_bytes() == before


def test_interactive_yes_and_explicit_yes_flag_replace(setup, keys):
    target, known, _lines = setup
    assert _run(target, ask=lambda q: True)[0] == 0
    assert HostKeys(str(known)).lookup(target.entry_name)[keys["new"].get_name()] == keys["new"]
    known.write_text(_line(target.entry_name, keys["old"]))
    code, _out, err = _run(target, yes=True)
    assert code == 0 and "WARNING" in err and "--yes" in err
    assert known.read_text() == _line(target.entry_name, keys["new"])


def test_hashed_entry_is_replaced_in_place_and_others_kept(setup, keys):
    target, known, lines = setup
    hashed = HostKeys.hash_host(target.entry_name)
    stale_rsa = "|1|c2FsdHNhbHRzYWx0c2FsdHNhbHQ=|aGFzaA== ssh-rsa AAAAB3NzaC1yc2E=\n"
    known.write_text(lines[1] + _line(hashed, keys["old"]) + stale_rsa)
    code, out, _err = _run(target, expect=rekey.fingerprint(keys["new"]))
    assert code == 0, out
    assert known.read_text() == lines[1] + _line(hashed, keys["new"]) + stale_rsa


def test_other_key_types_of_the_old_install_are_dropped(setup, keys):
    target, known, lines = setup
    rsa_line = f"{target.entry_name} ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQC7\n"
    known.write_text(lines[1] + rsa_line + _line(target.entry_name, keys["old"]))
    assert _run(target, expect=rekey.fingerprint(keys["new"]))[0] == 0
    assert known.read_text() == lines[1] + _line(target.entry_name, keys["new"])


def test_unreachable_host_names_host_and_fix(tmp_path):
    port = socket.create_server(("127.0.0.1", 0))
    free = port.getsockname()[1]
    port.close()
    target = rekey.Target("web9", "127.0.0.1", free, tmp_path / "known_hosts")
    with pytest.raises(rekey.RekeyError, match=r"web9 \(127\.0\.0\.1:\d+\).*cannot connect.*fix"):
        rekey.rekey(target, expect="SHA256:x")
    assert not (tmp_path / "known_hosts").exists()


def test_cli_resolves_host_from_a_pyinfra_inventory(tmp_path, sshd, keys):
    known = tmp_path / "kh"
    known.write_text(_line(f"[127.0.0.1]:{sshd.port}", keys["old"]))
    inventory = tmp_path / "inv.py"
    inventory.write_text(
        f"hosts = [('web1', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {sshd.port}, "
        f"'ssh_known_hosts_file': {str(known)!r}}}), ('web2', {{}})]\n"
    )
    argv = [sys.executable, "-m", "p40fleet.rekey", str(inventory), "web1"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    bad = subprocess.run([*argv, "--expect", rekey.fingerprint(keys["old"])], env=env,
                         capture_output=True, text=True, stdin=subprocess.DEVNULL)  # fmt: skip
    assert bad.returncode == 2, bad.stderr
    good = subprocess.run([*argv, "--expect", rekey.fingerprint(keys["new"])], env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)  # fmt: skip
    assert good.returncode == 0, good.stderr
    assert known.read_text() == _line(f"[127.0.0.1]:{sshd.port}", keys["new"])
    missing = subprocess.run([*argv[:-1], "web7", "--yes"], env=env, capture_output=True,
                             text=True, stdin=subprocess.DEVNULL)  # fmt: skip
    assert missing.returncode == 1 and "web7: not in inventory" in missing.stderr
    assert "web1, web2" in missing.stderr


def _resolved_from(cwd: Path, inventory: str, host: str) -> str:
    """``resolve()``'s known_hosts, run from ``cwd`` (a fresh interpreter, as the CLI runs)."""
    code = (
        "from p40fleet.cli.rekey import resolve; "
        f"print(resolve({inventory!r}, {host!r}).known_hosts)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_relative_known_hosts_is_the_repo_roots_whatever_the_cwd(tmp_path):
    """N11: the CLIs run pyinfra from the repo root, so a relative ``ssh_known_hosts_file``
    (inventories/lab.py's ``inventories/known_hosts.lab``) is that file, from any directory."""
    got = _resolved_from(REPO / "inventories", "lab.py", "p40-01")
    assert got == str(REPO / "inventories" / "known_hosts.lab")
    (tmp_path / "inv.py").write_text("hosts = [('h', {'ssh_known_hosts_file': 'kh/x'})]\n")
    assert _resolved_from(tmp_path, "inv.py", "h") == str(REPO / "kh" / "x")
    home = rekey.known_hosts_path("~/.ssh/known_hosts")
    assert home.is_absolute() and home == Path.home() / ".ssh" / "known_hosts"


def test_a_line_naming_several_machines_moves_only_the_named_one(keys):
    """N11: ``a,b KEY``: rekeying a leaves b on the old key (its own line), a gets the new."""
    old, new = keys["old"], keys["new"]
    lines = ["# lab\n", _line("192.0.2.11,192.0.2.12", old), _line("192.0.2.13", old)]
    got = rekey.replaced(lines, "192.0.2.11", new)
    assert got == ["# lab\n", _line("192.0.2.12", old), _line("192.0.2.11", new),
                   _line("192.0.2.13", old)]  # fmt: skip
    # another key type of the old install on a shared line: dropped for the host only
    rsa = "192.0.2.11,192.0.2.12 ssh-rsa AAAAB3NzaC1yc2E=\n"
    got = rekey.replaced([_line("192.0.2.11,192.0.2.12", old), rsa], "192.0.2.11", new)
    assert got == [_line("192.0.2.12", old), _line("192.0.2.11", new),
                   "192.0.2.12 ssh-rsa AAAAB3NzaC1yc2E=\n"]  # fmt: skip
