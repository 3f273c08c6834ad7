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

Connection failures: the guarded ``connect`` remembers why each host could not be reached
(:func:`connect_failure`: the sshguard refusal, or pyinfra's own error such as ``SSH host key
error (Host key for X does not match.)``) for the report's REFUSED / UNREACHABLE entries
(``p40fleet.report.connect_entry``); a host reached again later (after its reboot) is
forgotten there. When no host of the run could be reached pyinfra stops
before any deploy file runs, so the guard writes the report (``$P40FLEET_REPORT``) itself then.

Adapts pyinfra's ``SSHConnector`` (a class-level patch of ``connect``, ``run_shell_command``,
``put_file`` and ``get_file``): pyinfra has no hook that can refuse a connection or a command,
nor one that sees a connector's exceptions, so ``install()`` wraps those methods in place; it
is called explicitly (``config.py``, the deploy files), never on import. Idempotent. (A
connector plugin, ``@p40ssh/...`` under the ``pyinfra.connectors`` entry point, would be the
supported way; it would rename every host of every inventory.)

Checked against pyinfra 3.10.0 (``connectors/ssh.py``; ``api/operations.py`` and
``api/facts.py`` catch ``(TimeoutError, OSError, SSHException)`` per host, not ``EOFError``) and
paramiko 4.0.0.
"""

from __future__ import annotations

import functools
from typing import Any

from paramiko import SSHException
from pyinfra.api.exceptions import ConnectError
from pyinfra.connectors.ssh import SSHConnector

from p40fleet.host_key import REFUSED
from p40fleet.run_record import run_record

__all__ = [
    "connect_failure",
    "host_key_refusal",
    "install",
]

_GUARDED = ("run_shell_command", "put_file", "get_file")


def connect_failure(target: Any) -> tuple[str, str] | None:
    """``(kind, message)`` of ``target``'s failed connection in this run, or None."""
    return run_record(target.state).connect_failures.get(target.name)


def _record_failure(target: Any, kind: str, message: str) -> None:
    state = target.state
    failures = run_record(state).connect_failures
    failures[target.name] = (kind, message)
    hosts = [h for h in state.inventory if state.is_host_in_limit(h)]
    if hosts and all(h.name in failures for h in hosts):
        _report_nobody_reached(state, hosts)


def _report_nobody_reached(state: Any, hosts: list) -> None:
    """No host answered: pyinfra stops before any deploy, so write the report here."""
    import os

    from p40fleet import report

    path = os.environ.get(report.REPORT_ENV)
    if not path:
        return
    entries = {h.name: report.connect_entry(h.name, *connect_failure(h)) for h in hosts}
    report.write_report(report.build_report(entries, provenance=report.provenance()), path)


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
            _record_failure(self.host, REFUSED, refusal)
            raise ConnectError(refusal)
        try:
            connected = method(self, *args, **kwargs)
        except ConnectError as exc:
            _record_failure(self.host, "error", str(exc))
            raise
        # reached again (a reboot's wait): its refused connects while down are not its state
        run_record(self.host.state).connect_failures.pop(self.host.name, None)
        return connected

    guarded.p40fleet_guarded = True
    return guarded


def install() -> None:
    for name in _GUARDED:
        method = getattr(SSHConnector, name)
        if not getattr(method, "p40fleet_guarded", False):
            setattr(SSHConnector, name, _guard(method))
    if not getattr(SSHConnector.connect, "p40fleet_guarded", False):
        SSHConnector.connect = _guard_connect(SSHConnector.connect)
