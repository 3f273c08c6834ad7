"""Ray cluster: one head and the training nodes joining it, supervised by systemd.

    pyinfra -y inventories/lab.py deploy/ray.py     # after deploy/python.py (ray is in the env)

The steps: ``p40fleet/deploys/steps/ray.py``; from another repo's deploy file,
``p40fleet.deploys.ray()``.
"""

from p40fleet.deploys.steps import ray

ray.run()
