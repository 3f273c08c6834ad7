"""p40fleet.runtime.sshguard: a lost connection (paramiko's EOFError) becomes pyinfra's per-host
SSHException; a host whose key is not checked gets no connection, command or file (S17)."""

from __future__ import annotations

from pathlib import Path

import pytest
from paramiko import SSHException
from pyinfra.api.exceptions import ConnectError
from pyinfra.connectors.ssh import SSHConnector

from p40fleet.runtime import sshguard
from p40fleet.spec import clear_spec_cache
from tests.opharness import make_host

STRICT = {"ssh_strict_host_key_checking": "yes"}


@pytest.fixture
def sent(monkeypatch):
    """Every connect, command and file pyinfra's SSH connector would send, recorded (nothing
    leaves this machine); sshguard installed over the recorders."""
    calls: list[tuple[str, str]] = []

    def recorder(what):
        def record(self, *args, **kwargs):
            calls.append((what, self.host.name))
            return (True, None) if what != "connect" else None

        return record

    for what in ("connect", "run_shell_command", "put_file", "get_file"):
        monkeypatch.setattr(SSHConnector, what, recorder(what))
    clear_spec_cache()
    sshguard.install()
    yield calls
    clear_spec_cache()


def test_eof_becomes_ssh_exception_naming_the_host(monkeypatch, sent):
    def dies(self, *args, **kwargs):
        raise EOFError()

    monkeypatch.setattr(SSHConnector, "run_shell_command", dies)
    sshguard.install()
    _, host = make_host(STRICT, "lab2")
    with pytest.raises(SSHException, match="connection to lab2 lost mid-run"):
        host.connector.run_shell_command("true")


def test_install_is_idempotent():
    sshguard.install()
    once, connect = SSHConnector.put_file, SSHConnector.connect
    sshguard.install()
    assert SSHConnector.put_file is once and once.p40fleet_guarded
    assert SSHConnector.connect is connect and connect.p40fleet_guarded


@pytest.mark.parametrize("value", [None, "accept-new", "no"])
def test_unchecked_host_key_gets_no_connection_command_or_file(sent, value):
    data = {} if value is None else {"ssh_strict_host_key_checking": value}
    _, host = make_host(data, "p40-07")
    with pytest.raises(ConnectError, match="host p40-07: ssh_strict_host_key_checking = ") as exc:
        host.connector.connect()
    assert "expected 'yes'" in str(exc.value) and "its key was not learned" in str(exc.value)
    for call in (
        lambda: host.connector.run_shell_command("id"),
        lambda: host.connector.put_file("/dev/null", "/tmp/x"),
        lambda: host.connector.get_file("/etc/shadow", "/dev/null"),
    ):
        with pytest.raises(SSHException, match="nothing was sent to p40-07"):
            call()
    host.connect()  # pyinfra's own path: the host fails alone, it does not raise
    assert not host.connected
    assert sent == []


def test_checked_or_explicitly_allowed_host_connects(sent):
    _, strict = make_host(STRICT, "p40-01")
    allowed_data = {"stack_host": {"policy": {"allow_unverified_host_keys": True}}}
    _, allowed = make_host(allowed_data, "p40-02")
    for host in (strict, allowed):
        host.connector.connect()
        host.connector.run_shell_command("id")
    assert sent == [
        ("connect", "p40-01"), ("run_shell_command", "p40-01"),
        ("connect", "p40-02"), ("run_shell_command", "p40-02"),
    ]  # fmt: skip
    assert sshguard.host_key_refusal(make_host({}, "@local")[1]) is None  # not SSH


def test_config_py_installs_the_guard_before_pyinfra_connects(monkeypatch):
    """pyinfra execs ./config.py before connect_all: the guard is in place for the connect."""
    import runpy

    monkeypatch.setattr(SSHConnector, "connect", lambda self: None)
    runpy.run_path(str(Path(__file__).parents[1] / "config.py"))
    assert SSHConnector.connect.p40fleet_guarded


@pytest.mark.parametrize("deploy", ["deploy/facts.py", "deploy/verify.py", "deploy/full.py"])
def test_deploys_send_nothing_to_an_unchecked_host_even_once_connected(
    sent, deploy, capsys, monkeypatch
):
    """The entry points on their own (pyinfra connected before any guard, e.g. another
    --config): the host is refused with its reason, and not one command reaches it."""
    import pyinfra
    from pyinfra.api.state import StateStage
    from pyinfra.context import ctx_config, ctx_inventory, ctx_state
    from pyinfra_cli.util import load_deploy_file

    monkeypatch.setattr(pyinfra, "is_cli", True)  # local.include, as under pyinfra's CLI
    state, host = make_host({}, "p40-07")
    state.init(state.inventory, state.config)
    state.cwd = str(Path(__file__).parents[1])
    state.set_stage(StateStage.Prepare)
    host.connected = True  # as if pyinfra had connected with accept-new
    state.activate_host(host)
    with ctx_state.use(state), ctx_inventory.use(state.inventory), ctx_config.use(state.config):
        load_deploy_file(state, deploy)
    out = capsys.readouterr().out
    assert sent == [], sent
    if deploy != "deploy/full.py":
        assert "ssh_strict_host_key_checking" in out, out
    queued = [op.global_arguments.get("name", "") for op in state.ops.get(host, {}).values()]
    assert all("Refuse" in n or "Verify: refused" in n for n in queued), queued


def test_a_host_reached_again_after_refused_connects_is_no_longer_a_connect_failure(
    monkeypatch, sent
):
    """A reboot's wait: connects refused while the host is down, then it is back."""
    answers = [ConnectError("Could not connect (connection refused)"), None]

    def boots(self, *args, **kwargs):
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    monkeypatch.setattr(SSHConnector, "connect", boots)
    sshguard.install()
    _, host = make_host(STRICT, "lab3")
    with pytest.raises(ConnectError):
        host.connector.connect()
    assert sshguard.connect_failure(host) == ("error", "Could not connect (connection refused)")
    host.connector.connect()
    assert sshguard.connect_failure(host) is None
