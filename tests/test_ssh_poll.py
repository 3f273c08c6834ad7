"""p40fleet.runtime.ssh_poll: an idle paramiko transport wakes once a second, not ten times."""

from __future__ import annotations

import socket
import types

import paramiko
import pytest

from p40fleet.runtime import ssh_poll


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
