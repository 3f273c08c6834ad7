"""Guard pyinfra's SSH connector: no connection, command or file to a host whose key is not
checked, and a host that drops its connection mid-run does not abort the whole run.

Host keys (security S17): pyinfra's default ``ssh_strict_host_key_checking`` is
``accept-new``, which trusts and stores the first key it sees. ``install()`` makes
``SSHConnector.connect`` refuse, BEFORE it opens a socket, a host whose data does not say
``ssh_strict_host_key_checking=yes`` (unless its stack's ``policy.allow_unverified_host_keys``):
pyinfra fails that host alone ("Could not connect"), learns no key and sends nothing. The
command and file methods refuse such a host too, for an entry point that installs the guard
only after pyinfra has connected. ``config.py`` (pyinfra loads it from the working directory
before it connects) and every deploy file install it.

Lost connections: pyinfra 3.10 handles ``SSHException``/``OSError`` per host (that host
fails, the others go on), but paramiko reports a connection that died under an open transport
as ``EOFError``, which escapes pyinfra's handlers and ends the run for every host. The guarded
methods turn ``EOFError`` into ``SSHException`` naming the host.

pyinfra has no hook for either, so ``install()`` patches ``SSHConnector``'s methods in place;
it is called explicitly, never on import. Idempotent.
"""

from __future__ import annotations

import functools
from typing import Any

from paramiko import SSHException
from pyinfra.api.exceptions import ConnectError
from pyinfra.connectors.ssh import SSHConnector

__all__ = ["host_key_refusal", "install"]

_GUARDED = ("run_shell_command", "put_file", "get_file")


def host_key_refusal(host: Any) -> str | None:
    """Why ``host`` must get no connection (its host key would not be checked), or None."""
    from p40fleet.spec import SpecError, host_key_problem, load_spec, spec_for_host

    try:
        spec = spec_for_host(host)
    except SpecError:
        spec = load_spec(host.name, {})  # the spec is refused later; the key rule still holds
    problem = host_key_problem(host, spec)
    if problem is None:
        return None
    return f"{problem}; nothing was sent to {host.name} and its key was not learned"


def _guard(method):
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        refusal = host_key_refusal(self.host)
        if refusal is not None:
            raise SSHException(refusal)
        try:
            return method(self, *args, **kwargs)
        except EOFError as exc:
            raise SSHException(
                f"connection to {self.host.name} lost mid-run (the host went down or sshd "
                "died): bring it back and re-run"
            ) from exc

    guarded.p40fleet_guarded = True
    return guarded


def _guard_connect(method):
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        refusal = host_key_refusal(self.host)
        if refusal is not None:
            raise ConnectError(refusal)
        return method(self, *args, **kwargs)

    guarded.p40fleet_guarded = True
    return guarded


def install() -> None:
    for name in _GUARDED:
        method = getattr(SSHConnector, name)
        if not getattr(method, "p40fleet_guarded", False):
            setattr(SSHConnector, name, _guard(method))
    if not getattr(SSHConnector.connect, "p40fleet_guarded", False):
        SSHConnector.connect = _guard_connect(SSHConnector.connect)
