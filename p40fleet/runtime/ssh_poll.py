"""Let an idle SSH connection wake once a second, not ten times, while the run waits on a host.

paramiko's transport reads its socket with a 0.1 s timeout and, on each timeout, only checks
whether the transport was closed (and whether a keepalive or rekey is due). Under pyinfra's
gevent every wake is a timer, a greenlet switch and a raised ``socket.timeout``: about 1.5 ms
of controller CPU per host for every second the run waits on that host (measured: a 20 s
``sleep`` on 3 hosts cost 0.09 s; under 0.02 s with this). It adds up on the lab, where the
verify probe keeps 8 hosts waiting half a minute, and on any fleet during a driver, CUDA or Apex
build that runs for minutes. A 1 s timeout keeps every one of those checks, a second later at
most.

Adapts paramiko's transport (its socket timeout, ``Transport._active_check_timeout`` = 0.1 s).
Public API only: ``host.connector.client`` (pyinfra's SSH connector), paramiko's
``SSHClient.get_transport()`` and ``Transport.sock``. Called by ``deploy/preflight.py`` for
each host it prepares, never on import; a connector without a paramiko client (``@local``,
a test's stand-in) is left alone.

Checked against pyinfra 3.10.0 and paramiko 4.0.0 (``transport.py``, ``packet.py``: the socket
timeout is used only for those idle checks).
"""

from __future__ import annotations

from typing import Any

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
