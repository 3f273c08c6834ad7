"""System layer: artifacts, nouveau out, NVIDIA driver, CUDA toolkit, cuDNN — idempotent.

    pyinfra -y inventories/sim.py deploy/system.py

The steps: ``p40fleet/deploys/steps/system.py``; from another repo's deploy file,
``p40fleet.deploys.system()``.
"""

from p40fleet.deploys.steps import system

system.run()
