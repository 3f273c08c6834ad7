"""Preflight: every refusal decided before any host changes.

    pyinfra INVENTORY deploy/preflight.py   (deploy/full.py runs it first)

The steps: ``p40fleet/deploys/steps/preflight.py``; from another repo's deploy file,
``p40fleet.deploys.preflight()``.
"""

from p40fleet.deploys.steps import preflight

preflight.run()
