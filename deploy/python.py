"""Python layer: training user, Miniconda, conda env, torch, Apex (built once), verl — idempotent.

    pyinfra -y inventories/sim.py deploy/python.py

The steps: ``p40fleet/deploys/steps/python.py``; from another repo's deploy file,
``p40fleet.deploys.python()``.
"""

from p40fleet.deploys.steps import python as python_layer

python_layer.run()
