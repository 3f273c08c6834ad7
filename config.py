"""pyinfra's config file, loaded from the working directory BEFORE pyinfra connects.

Installs ``p40fleet.runtime.sshguard``: a host whose SSH host key would not be checked (no
``ssh_strict_host_key_checking=yes``) is refused before any connection, so pyinfra never learns
its key nor sends it a command (security S17). Every deploy file installs it again (idempotent)
for a run started elsewhere.
"""

from p40fleet.runtime import sshguard

sshguard.install()
