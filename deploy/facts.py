"""Read-only fleet facts table: GPUs, capability, profile, driver, verdict per host.

    pyinfra @local deploy/facts.py -y
    pyinfra inventories/sim.py deploy/facts.py -y

The steps: ``p40fleet/deploys/steps/facts.py``; from another repo's deploy file,
``p40fleet.deploys.facts()``.
"""

from p40fleet.deploys.steps import facts

facts.run()
