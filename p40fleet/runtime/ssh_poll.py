"""Let an idle SSH connection wake once a second, not ten times, while the run waits on a host.

Adapts paramiko: its transport reads its socket with a 0.1 s timeout
(``Transport._active_check_timeout``) and, on each timeout, only checks whether the transport
was closed (and whether a keepalive or rekey is due). Under pyinfra's gevent every wake is a
timer, a greenlet switch and a raised ``socket.timeout``: about 1.5 ms of controller CPU per
host for every second the run waits on that host (measured: a 20 s ``sleep`` on 3 hosts cost
0.09 s; under 0.02 s with this). It adds up on the lab, where the verify probe keeps 8 hosts
waiting half a minute, and on any fleet during a driver, CUDA or Apex build that runs for
minutes. A 1 s timeout keeps every one of those checks, a second later at most.

Installed through pyinfra's public hook: :func:`install` adds a ``BaseStateCallback`` whose
``host_connect`` sets the timeout on every connect, reconnects included (pyinfra triggers it
in ``Host.connect``), so a host that ``server.reboot`` reconnects (a new ``SSHClient`` and a
new transport at 0.1 s) keeps the slow wake-up for the waits after the reboot. A host already
connected when the callback is added (pyinfra connects every host before the deploy files run)
gets it at once. Reads only ``host.connector.client`` (pyinfra's SSH connector), paramiko's
``SSHClient.get_transport()`` and ``Transport.sock``; a connector without a paramiko client
(``@local``, a test's stand-in) is left alone.

Checked against pyinfra 3.10.0 (``api/host.py`` ``connect``, ``operations/server.py``
``reboot``) and paramiko 4.0.0 (``transport.py``, ``packet.py``: the socket timeout is used
only for those idle checks).
"""

from __future__ import annotations

from typing import Any

from pyinfra.api import BaseStateCallback

__all__ = ["IDLE_WAKE_S", "SlowIdleWakes", "install", "slow_idle_wakes"]

#: Seconds an idle transport waits on its socket before it looks at its own state again.
IDLE_WAKE_S = 1.0


def slow_idle_wakes(host: Any, seconds: float = IDLE_WAKE_S) -> bool:
    """Set the socket timeout of ``host``'s SSH transport; True when there was one to set."""
    client = getattr(getattr(host, "connector", None), "client", None)
    get_transport = getattr(client, "get_transport", None)
    transport = get_transport() if callable(get_transport) else None
    sock = getattr(transport, "sock", None)
    if sock is None or not hasattr(sock, "settimeout"):
        return False
    sock.settimeout(seconds)
    return True


class SlowIdleWakes(BaseStateCallback):
    """On every connect of a host (a reboot's reconnect too): :func:`slow_idle_wakes`."""

    @staticmethod
    def host_connect(state: Any, host: Any) -> None:  # noqa: ARG004 - pyinfra's signature
        slow_idle_wakes(host)


def install(state: Any, host: Any | None = None) -> bool:
    """Add :class:`SlowIdleWakes` to ``state`` once; set ``host``'s transport now (it is
    already connected when a deploy file runs). True when the callback was added now."""
    # Asked of the state's own list, nothing kept here: a deploy file passes pyinfra's
    # ``from pyinfra import state``, a proxy of whichever State is current.
    added = not any(isinstance(h, SlowIdleWakes) for h in state.callback_handlers)
    if added:
        state.add_callback_handler(SlowIdleWakes())
    if host is not None:
        slow_idle_wakes(host)
    return added
