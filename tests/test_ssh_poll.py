"""p40fleet.runtime.ssh_poll: an idle paramiko transport wakes once a second instead of ten
times, on every connect of a host: a reboot's reconnect (a new transport) too."""

from __future__ import annotations

import socket
import types

import paramiko
import pytest
from pyinfra.connectors.ssh import SSHConnector

from p40fleet.runtime import ssh_poll
from tests.opharness import make_host


@pytest.fixture
def transport():
    """A real (unstarted) paramiko Transport on one end of a socket pair."""
    ours, theirs = socket.socketpair()
    made = paramiko.Transport(ours)
    yield made
    made.close()
    ours.close()
    theirs.close()


def _host_with(transport):
    client = types.SimpleNamespace(get_transport=lambda: transport)
    return types.SimpleNamespace(name="lab1", connector=types.SimpleNamespace(client=client))


def test_paramiko_polls_every_tenth_of_a_second_and_the_host_then_once_a_second(transport):
    assert transport.sock.gettimeout() == pytest.approx(0.1)  # paramiko's own wake interval
    assert ssh_poll.slow_idle_wakes(_host_with(transport)) is True
    assert transport.sock.gettimeout() == pytest.approx(ssh_poll.IDLE_WAKE_S)


@pytest.mark.parametrize(
    "host",
    [
        types.SimpleNamespace(name="@local", connector=types.SimpleNamespace()),  # no client
        types.SimpleNamespace(name="x", connector=types.SimpleNamespace(client=None)),
        types.SimpleNamespace(  # not connected yet
            name="y",
            connector=types.SimpleNamespace(
                client=types.SimpleNamespace(get_transport=lambda: None)
            ),
        ),
        types.SimpleNamespace(name="stand-in"),  # a test's host without a connector
    ],
)
def test_a_host_without_a_paramiko_transport_is_left_alone(host):
    assert ssh_poll.slow_idle_wakes(host) is False


@pytest.fixture
def reconnecting(monkeypatch):
    """A real pyinfra (state, host) whose SSH connector, on each connect, gets a new paramiko
    client with a new (unstarted) Transport at paramiko's 0.1 s, as pyinfra's ``connect`` makes
    one (``server.reboot`` disconnects and connects again); nothing leaves this machine."""
    made: list[paramiko.Transport] = []
    sockets: list[socket.socket] = []

    def connect(self, *args, **kwargs):
        ours, theirs = socket.socketpair()
        sockets.extend((ours, theirs))
        made.append(paramiko.Transport(ours))
        transport = made[-1]
        self.client = types.SimpleNamespace(get_transport=lambda: transport)

    monkeypatch.setattr(SSHConnector, "connect", connect)
    state, host = make_host({"ssh_strict_host_key_checking": "yes"}, "lab3")
    yield state, host, made
    for transport in made:
        transport.close()
    for sock in sockets:
        sock.close()


def _reboot_reconnect(host) -> None:
    """What ``server.reboot``'s ``wait_and_reconnect`` does to the connection (pyinfra 3.10)."""
    host.disconnect()
    host.connect(show_errors=False)


def test_the_slow_wake_holds_on_the_transport_a_reboot_reconnect_makes(reconnecting):
    state, host, made = reconnecting
    host.connect()  # pyinfra connects every host before a deploy file runs
    assert ssh_poll.install(state, host) is True  # deploy/preflight.py, on the connected host
    assert made[0].sock.gettimeout() == pytest.approx(ssh_poll.IDLE_WAKE_S)
    _reboot_reconnect(host)
    assert len(made) == 2 and made[1] is not made[0]  # a new transport, made at 0.1 s
    assert made[1].sock.gettimeout() == pytest.approx(ssh_poll.IDLE_WAKE_S)  # host_connect
    _reboot_reconnect(host)  # a second reboot (nouveau, then the driver)
    assert made[2].sock.gettimeout() == pytest.approx(ssh_poll.IDLE_WAKE_S)


def test_setting_it_once_is_lost_at_the_reconnect(reconnecting):
    """The old way (once per host, when the deploy file runs): the reconnect's transport runs
    at paramiko's 0.1 s, which is why it is a host_connect callback."""
    _state, host, made = reconnecting
    host.connect()
    assert ssh_poll.slow_idle_wakes(host) is True
    _reboot_reconnect(host)
    assert made[1].sock.gettimeout() == pytest.approx(0.1)


def test_install_adds_one_callback_per_state(reconnecting):
    state, host, made = reconnecting
    before = len(state.callback_handlers)
    assert ssh_poll.install(state) is True
    assert ssh_poll.install(state, host) is False  # every deploy file calls it for its host
    assert len(state.callback_handlers) == before + 1
    assert isinstance(state.callback_handlers[-1], ssh_poll.SlowIdleWakes)
    host.connect()  # installed before the connect (a config.py could): the first connect too
    assert made[0].sock.gettimeout() == pytest.approx(ssh_poll.IDLE_WAKE_S)


def test_install_through_pyinfras_state_proxy_counts_each_state_once(monkeypatch):
    """Deploy files pass ``from pyinfra import state``, a proxy of the current State: a second
    State in the same process (the tests, an API run) gets its own callback."""
    from pyinfra import state as proxy
    from pyinfra.context import ctx_state

    first, _ = make_host({}, "lab4")
    second, _ = make_host({}, "lab5")
    with ctx_state.use(first):
        assert ssh_poll.install(proxy) is True
        assert ssh_poll.install(proxy) is False
    with ctx_state.use(second):
        assert ssh_poll.install(proxy) is True
    for one in (first, second):
        assert sum(isinstance(h, ssh_poll.SlowIdleWakes) for h in one.callback_handlers) == 1
