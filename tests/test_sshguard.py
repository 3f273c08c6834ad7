"""A connection lost mid-run (paramiko's EOFError) becomes pyinfra's per-host SSHException."""

import pytest
from paramiko import SSHException
from pyinfra.connectors.ssh import SSHConnector

from p40fleet import sshguard


class _Host:
    name = "lab2"


def test_eof_becomes_ssh_exception_naming_the_host(monkeypatch):
    def dies(self, *args, **kwargs):
        raise EOFError()

    monkeypatch.setattr(SSHConnector, "run_shell_command", dies)
    sshguard.install()
    connector = SSHConnector.__new__(SSHConnector)
    connector.host = _Host()
    with pytest.raises(SSHException, match="connection to lab2 lost mid-run"):
        connector.run_shell_command("true")


def test_install_is_idempotent():
    sshguard.install()
    once = SSHConnector.put_file
    sshguard.install()
    assert SSHConnector.put_file is once and once.p40fleet_guarded
