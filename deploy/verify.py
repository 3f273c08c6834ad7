"""Verify the stack on every host — changes nothing.

    pyinfra -y inventories/sim.py deploy/verify.py          # table; exit != 0 if a host fails
    python -m p40fleet.verify inventories/sim.py --json r.json   # same, exit 0 / 1 / 2

The steps: ``p40fleet/deploys/steps/verify.py``; from another repo's deploy file,
``p40fleet.deploys.verify()``.
"""

from p40fleet.deploys.steps import verify

verify.run()
