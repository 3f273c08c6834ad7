"""Uninstall: undo what the deploys left on a host (docs/footprint.md), keeping the home.

    pyinfra INVENTORY deploy/uninstall.py --limit HOST     # then reboot: nouveau is back
    pyinfra INVENTORY deploy/uninstall.py --limit HOST --dry

Walks ``p40fleet.footprint.FOOTPRINT`` (the list docs/footprint.md is generated from) in
``operations.uninstall.ORDER``: the Ray unit, the driver through its own uninstaller, the CUDA
link, the nouveau blacklist (initramfs rebuilt), the mirror's apt source (the distribution's
sources moved back), the Apex build account, the CUDA and cuDNN trees, the profile script and
p40fleet's root-owned state; the training user and its home only with
``stack.policy.uninstall_home: remove``. Each step decides from facts: a second uninstall
changes nothing, and ``deploy/full.py`` converges the host again. No GPU or OS refusals (the
preflight is not run): only the spec (for the paths) and the run lock.
"""

from __future__ import annotations

from pyinfra import host, state

from p40fleet import footprint
from p40fleet.facts.survey import install as keep_facts
from p40fleet.operations import uninstall
from p40fleet.operations.run.spec import validated_spec
from p40fleet.runtime import deploy_frames, ssh_poll, sshguard


def run() -> None:
    """The deploy's steps for the current host (``deploy/uninstall.py`` calls it)."""
    sshguard.install()
    keep_facts(state)
    deploy_frames.install_for(state)
    ssh_poll.install(state, host)  # now, and again on every reconnect
    spec = validated_spec()  # takes this run's lock on the host, released after the last step

    if spec is None:
        return

    for kind in uninstall.ORDER:
        for item in footprint.items(spec, undo=kind):
            uninstall.undo(item, spec)
