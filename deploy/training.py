"""Training: the model and data a host trains on, and a ``~/launch-ppo.sh`` right for its GPUs.

    pyinfra -y inventories/lab.py deploy/training.py

The steps: ``p40fleet/deploys/steps/training.py``; from another repo's deploy file,
``p40fleet.deploys.training()``.
"""

from p40fleet.deploys.steps import training

training.run()
