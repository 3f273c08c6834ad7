"""Provision a P40 fleet for verl, in the seed's order.

    pyinfra inventories/lab.py deploy/full.py          # a real lab
    pyinfra -y inventories/sim.py deploy/full.py       # the simulated lab (make demo)
    pyinfra inventories/sim.py deploy/full.py --dry    # what would change, changing nothing

The steps: ``p40fleet/deploys/steps/full.py``; from another repo's deploy file,
``p40fleet.deploys.full()``.
"""

from p40fleet.deploys.steps import full

full.run()
