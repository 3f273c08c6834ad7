"""operations.util.reboot: a reconnect that lands on the dying host waits, it does not crash.

The lab's CI failure this answers: lab3 was reconnected while its sshd still accepted
connections during the shutdown; the uptime read died with the connection and pyinfra 3.10's
``server.reboot`` raised ``TypeError('<' not supported between NoneType and int)``, failing the
host mid-reboot.
"""

from __future__ import annotations

import pytest
from paramiko import SSHException
from pyinfra.api import Config, Inventory, State
from pyinfra.api.exceptions import ConnectError
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.context import ctx_host, ctx_state
from pyinfra.operations import server

from p40fleet.operations.util import reboot

UP, DOWN, DIES = "up", "down", "dies"


class BootingConnector:
    """A connector whose host goes through ``script``: one entry per connect attempt —
    ``DOWN`` (the connect fails), ``DIES`` (it connects, the command loses the connection), or
    an uptime (it connects and answers it)."""

    def __init__(self, host, first_uptime: int, script: list):
        self.host = host
        self.uptime = first_uptime  # what the old boot answers before the reboot starts
        self.script = list(script)
        self.now: object = first_uptime
        self.commands: list[str] = []
        self.connects = 0

    def connect(self):
        self.connects += 1
        self.now = self.script.pop(0) if self.script else DOWN
        if self.now == DOWN:
            raise ConnectError("Could not connect (connection refused)")

    def disconnect(self):
        pass

    def run_shell_command(self, command, **kwargs):  # noqa: ARG002 - the connector's signature
        raw = command if isinstance(command, str) else command.get_raw_value()
        if "uname" in raw:  # pyinfra's Uptime fact asks the Kernel fact first
            return True, CommandOutput([OutputLine("stdout", "Linux")])
        self.commands.append(raw)
        if self.now == DIES:
            raise SSHException(f"connection to {self.host.name} lost mid-run")
        return True, CommandOutput([OutputLine("stdout", f"{self.now}")])


def booting(script: list, first_uptime: int = 5000):
    """lab3 going through ``script``, in an inventory with lab4 (one failed host is not all)."""
    data = {"ssh_strict_host_key_checking": "yes"}
    inventory = Inventory(([("lab3", dict(data)), ("lab4", dict(data))], {}))
    state = State(inventory, Config())
    host = inventory.get_host("lab3")
    state.active_hosts = set(inventory)
    host.connector = BootingConnector(host, first_uptime, script)
    host.connected = True
    return state, host


def no_sleep(_seconds: float) -> None:
    pass


def test_a_reconnect_whose_read_dies_with_the_old_boot_waits_for_the_new_boot():
    # the old boot answers once more, then dies mid-command, then is down, then the new boot
    _state, host = booting([5003, DIES, DOWN, DOWN, 4])
    assert reboot.wait_until_back(host, 5000, 2, 1, 600, sleep=no_sleep) is True
    assert host.connected and host.connector.connects == 5
    assert host.connector.commands == [reboot.UPTIME_COMMAND] * 3


def test_pyinfra_server_reboot_fails_the_same_host_where_ours_waits(monkeypatch):
    """pyinfra 3.10's own wait: the failed fact is None and the comparison raises. When this
    stops failing, pyinfra fixed it and ``operations.util.reboot`` can go."""
    state, host = booting([DIES, DOWN, 4])
    monkeypatch.setattr(server, "sleep", no_sleep)
    gen = server.reboot._inner(delay=2, interval=1, reboot_timeout=600)
    commands = list(gen)
    capture, wait = commands[1].function, commands[3].function
    with ctx_state.use(state), ctx_host.use(host):
        capture(state, host)
        with pytest.raises(TypeError, match="not supported between"):
            wait(state, host)
    assert host in state.failed_hosts  # the fact that died failed the host, too


def test_the_same_boot_answering_is_not_back_yet():
    _state, host = booting([5002, 5003, 5004])  # sshd up the whole time: no reboot happened
    assert reboot.wait_until_back(host, 5000, 2, 1, 5, sleep=no_sleep) is False
    assert host.connector.connects == 4  # at 2, 3, 4, 5 s waited, then the timeout


def test_not_back_in_time_says_which_host_and_what_to_check(monkeypatch):
    said: list[str] = []
    _state, host = booting([])
    monkeypatch.setattr(type(host), "log_styled", lambda self, msg, **_kw: said.append(msg))
    assert reboot.wait_until_back(host, 5000, 2, 1, 4, sleep=no_sleep) is False
    (message,) = said
    assert message.startswith("host lab3: reboot: not back within 4s")
    assert "console" in message


def test_an_unreadable_uptime_is_none_not_a_number():
    _state, host = booting([])
    host.connector.now = "garbage"
    assert reboot.read_uptime(host) is None
    host.connector.now = DIES
    assert reboot.read_uptime(host) is None
    host.connector.now = 17
    assert reboot.read_uptime(host) == 17


def test_the_uptime_before_must_be_readable_or_the_host_fails_before_rebooting():
    state, host = booting([])
    host.connector.now = DIES
    capture, reboot_command, _wait = reboot.rebooted(2, 1, 600)
    assert capture.function(state, host) is False
    assert reboot_command.get_raw_value() == "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &"


def test_a_fractional_wait_never_confirms_the_old_boot():
    # uptime truncated to whole seconds: 1.5 s waited on a host up 5000.0 s answers 5001
    _state, host = booting([5001, 3])
    assert reboot.wait_until_back(host, 5000, 1.5, 1, 600, sleep=no_sleep) is True
    assert host.connector.connects == 2
