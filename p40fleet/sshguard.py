"""Keep a host that drops its connection mid-run from aborting the whole run.

pyinfra 3.10 handles ``SSHException``/``OSError`` per host (that host fails, the others go on),
but paramiko reports a connection that died under an open transport as ``EOFError``, which
escapes pyinfra's handlers and ends the run for every host. ``install()`` wraps the SSH
connector's command and file methods so that ``EOFError`` surfaces as ``SSHException`` naming
the host. pyinfra has no hook for this, so ``install()`` patches ``SSHConnector``'s three
methods in place; it is called explicitly by ``deploy/preflight.py`` (which every deploy
includes), never on import. Idempotent.
"""

from __future__ import annotations

import functools

from paramiko import SSHException
from pyinfra.connectors.ssh import SSHConnector

_GUARDED = ("run_shell_command", "put_file", "get_file")


def _guard(method):
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except EOFError as exc:
            raise SSHException(
                f"connection to {self.host.name} lost mid-run (the host went down or sshd "
                "died): bring it back and re-run"
            ) from exc

    guarded.p40fleet_guarded = True
    return guarded


def install() -> None:
    for name in _GUARDED:
        method = getattr(SSHConnector, name)
        if not getattr(method, "p40fleet_guarded", False):
            setattr(SSHConnector, name, _guard(method))
