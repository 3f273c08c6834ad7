"""p40fleet's pyinfra operations, one module per concern."""

from p40fleet import sshguard

sshguard.install()  # a host lost mid-run fails alone instead of ending the run (see sshguard)
