"""Uninstall: undo what the deploys left on a host (docs/footprint.md), keeping the home.

    pyinfra INVENTORY deploy/uninstall.py --limit HOST     # then reboot: nouveau is back
    pyinfra INVENTORY deploy/uninstall.py --limit HOST --dry

The steps: ``p40fleet/deploys/steps/uninstall.py``; from another repo's deploy file,
``p40fleet.deploys.uninstall()``.
"""

from p40fleet.deploys.steps import uninstall

uninstall.run()
