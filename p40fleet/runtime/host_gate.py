"""A gate each host passes once, before its first operation of the run: one it refuses fails
alone, before any of its operations runs, and the other hosts go on.

Adapts pyinfra's execution order (``api/operations.py``), through its public hook, a
``BaseStateCallback`` added to the State; the run lock (``operations.run_lock``) is its user:

- the default run and ``--parallel N``: ``_run_single_op`` triggers ``operation_start`` on the
  main greenlet and only then asks for the active hosts that run the operation, so a host
  failed there (``State.fail_hosts``) runs neither it nor any later one. The gate runs at the
  run's first ``operation_start``, for every active host at once (``admit`` may spawn on
  ``state.pool``). When no host is left, ``fail_hosts`` raises pyinfra's own "No hosts
  remaining!", as it does after an operation that failed everywhere.
- ``--serial``: no ``operation_start``; each host runs its operations in turn, each opened by
  ``operation_host_start`` (the host's context set). A ``PyinfraError`` raised there ends that
  host's operations, and ``_run_serial_ops`` fails that host alone. The gate runs there, at the
  host's first operation.
- ``--no-wait`` (refused by every deploy that locks, ``p40fleet.run_mode``): its greenlets drop
  the error, so a refused host would run on.

A ``--dry`` run executes nothing: no callback fires and the gate takes nothing. Why not from
an operation's body: pyinfra runs a body when it prepares and again when it executes; a body
that acts only on the second pass leans on that, and its command is not one pyinfra counts.

Checked against pyinfra 3.10.0 (``api/operations.py`` ``run_ops``, ``_run_single_op``,
``_run_serial_ops``, ``run_host_op``; ``api/state.py`` ``fail_hosts``, ``trigger_callbacks``).
"""

from __future__ import annotations

from typing import Any

from pyinfra.api import BaseStateCallback
from pyinfra.api.exceptions import PyinfraError

__all__ = ["HostGate", "install"]


class HostGate(BaseStateCallback):
    """Subclass it with :meth:`admit`; add it with :func:`install` (once per State)."""

    def __init__(self) -> None:
        self.gated: set[str] = set()  # host names that met the gate in this run

    def admit(self, state: Any, hosts: list[Any]) -> dict[Any, str]:  # noqa: ARG002
        """The hosts of ``hosts`` refused, each with why (already said to the user)."""
        return {}

    def _ungated(self, hosts: list[Any]) -> list[Any]:
        fresh = [one for one in hosts if one.name not in self.gated]
        self.gated.update(one.name for one in fresh)
        return fresh

    def operation_start(self, state: Any, op_hash: str) -> None:  # noqa: ARG002
        hosts = self._ungated(state.inventory.get_active_hosts())
        if hosts:
            state.fail_hosts(set(self.admit(state, hosts)))

    def operation_host_start(self, state: Any, host: Any, op_hash: str) -> None:  # noqa: ARG002
        hosts = self._ungated([host])  # --serial: operation_start never came
        refused = self.admit(state, hosts) if hosts else {}
        if host in refused:
            raise PyinfraError(refused[host])


def install(state: Any, gate: type[HostGate]) -> bool:
    """Add one ``gate()`` to ``state`` unless one is there; True when it was added now."""
    # Asked of the state's own list, nothing kept here: a deploy file passes pyinfra's
    # ``from pyinfra import state``, a proxy of whichever State is current.
    if any(isinstance(handler, gate) for handler in state.callback_handlers):
        return False
    state.add_callback_handler(gate())
    return True
