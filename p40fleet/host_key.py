"""The words of a host-key refusal, shared by the guard that refuses
(``p40fleet.runtime.sshguard``), the deploys that say it (``operations.run.spec``,
``deploy/verify.py``) and the report that records it (``p40fleet.report``): pure constants, so
the report needs no pyinfra adapter."""

from __future__ import annotations

__all__ = ["HOST_KEY_REMEDY", "HOST_KEY_STEP", "REFUSED"]

#: The refusal of a host whose key would not be checked: its step and fix (every entry point).
HOST_KEY_STEP = "ssh host key"
HOST_KEY_REMEDY = (
    "set ssh_strict_host_key_checking=yes with the hosts' keys in ssh_known_hosts_file "
    "(python -m p40fleet.rekey records a new one), then re-run"
)
#: :func:`connect_failure`'s kind for a host this guard refused (else ``"error"``).
REFUSED = "refused"
