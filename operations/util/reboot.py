"""Reboot a host and wait until it is back, as ``pyinfra.operations.server.reboot`` does, but a
reconnect that lands on the dying host is "not back yet", not a crash.

pyinfra 3.10's ``wait_and_reconnect`` reads the ``Uptime`` fact once it has connected again. When
sshd still accepts that connection while the host shuts down (a slow shutdown: common on a real
server, seen in the lab), the fact's command dies with the connection: ``get_fact`` fails the
host and returns None, and ``None < int`` raises ``TypeError`` in the callback. Here the uptime
is read with a plain command whose failure (lost connection, timeout, no answer) means "try
again": disconnect, wait ``interval``, reconnect, until ``reboot_timeout``. The reboot is
confirmed when the uptime is lower than before plus the time waited (the lab's time namespace
starts the uptime near 0 on each boot, as a real boot does).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

from pyinfra import logger
from pyinfra.api import FunctionCommand, StringCommand
from pyinfra.connectors.util import clear_askpass_cache, remove_any_sudo_askpass_file

__all__ = ["READ_TIMEOUT_S", "UPTIME_COMMAND", "read_uptime", "rebooted", "wait_until_back"]

UPTIME_COMMAND = "cut -d. -f1 /proc/uptime"
#: A reconnect to a host that froze while shutting down must not hang the wait.
READ_TIMEOUT_S = 10


def read_uptime(host) -> int | None:
    """The host's uptime in whole seconds, or None when it cannot answer now."""
    try:
        ok, output = host.run_shell_command(StringCommand(UPTIME_COMMAND), _timeout=READ_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - a host going down fails in any way it likes
        logger.debug("%suptime not readable yet: %r", host.print_prefix, exc)
        return None
    lines = output.stdout_lines if ok else []
    if len(lines) != 1 or not lines[0].strip().isdigit():
        return None
    return int(lines[0].strip())


def wait_until_back(
    host,
    before: int,
    delay: float,
    interval: float,
    reboot_timeout: float,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Reconnect until ``host`` answers with an uptime that started after ``before``; False
    (after saying why, naming the host) when ``reboot_timeout`` passes first."""
    sleep(delay)
    clear_askpass_cache(host)  # the old boot's askpass files went with it
    host.disconnect()
    waited = delay
    while True:
        host.connect(show_errors=False)
        if host.connected:
            now = read_uptime(host)
            if now is not None and now < before + math.floor(waited):
                return True
            # still the old boot (sshd not down yet) or a command that died with it
            host.disconnect()
        if waited >= reboot_timeout:
            host.log_styled(
                f"host {host.name}: reboot: not back within {reboot_timeout:g}s — fix: check "
                "the host's console (it may wait at a prompt or have failed to boot), then re-run",
                fg="red",
            )
            return False
        sleep(interval)
        waited += interval


def rebooted(delay: float, interval: float, reboot_timeout: float) -> Iterator:
    """The commands of an operation that reboots the host and waits for it (see the module)."""
    before: list[int] = []

    def capture_uptime(state, host) -> bool:  # noqa: ARG001 - pyinfra's signature
        remove_any_sudo_askpass_file(host)  # a reboot that fails must not leave it behind
        uptime = read_uptime(host)
        if uptime is None:
            host.log_styled(f"host {host.name}: reboot: cannot read /proc/uptime", fg="red")
            return False
        before.append(uptime)
        return True

    yield FunctionCommand(capture_uptime, (), {})
    # Detached, so the channel closes at once (pyinfra #1708: a ProxyCommand keeps it open).
    yield StringCommand("( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &")

    def wait(state, host) -> bool:  # noqa: ARG001 - pyinfra's signature
        return wait_until_back(host, before[0], delay, interval, reboot_timeout)

    yield FunctionCommand(wait, (), {})
