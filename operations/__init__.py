"""p40fleet's pyinfra operations, one module per concern."""

from p40fleet import factbatch, sshguard

sshguard.install()  # a host lost mid-run fails alone instead of ending the run (see sshguard)
factbatch.install()  # each fact once per host, a host's facts in one command (see factbatch)
