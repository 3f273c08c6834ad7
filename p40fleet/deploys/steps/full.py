"""Provision a P40 fleet for verl, in the seed's order.

    pyinfra inventories/lab.py deploy/full.py          # a real lab
    pyinfra -y inventories/sim.py deploy/full.py       # the simulated lab (make demo)
    pyinfra inventories/sim.py deploy/full.py --dry    # what would change, changing nothing

Facts are gathered as each step needs them; a second run changes nothing.
"""

from pyinfra import host

from p40fleet.deploys.steps import preflight as preflight_steps
from p40fleet.deploys.steps import python, system, training
from p40fleet.operations.run.verify import verify_after_run
from p40fleet.runtime.included import included
from p40fleet.spec import SpecError, spec_for_host


def run() -> None:
    """The deploy's steps for the current host (``deploy/full.py`` calls it)."""
    # 1. Preflight: spec, GPUs (PCI ids, before any driver), OS, space, mirror — refusals first.
    with included("deploy/preflight.py"):
        preflight_steps.run()
    # 2. System layer: nouveau out, driver 525, CUDA 11.8 toolkit, cuDNN 8.9.7 hard-linked.
    with included("deploy/system.py"):
        system.run()
    # 3. Python layer: training user, Miniconda + env, torch, Apex, verl patched + --no-deps.
    with included("deploy/python.py"):
        python.run()
    # 4. Training: a launch script for verl's PPO in the training user's home, right for its GPUs.
    with included("deploy/training.py"):
        training.run()
    # 5. Verification: the three-line check and the rest, once the last operation has run
    #    (deploy/verify.py alone checks hosts as they are now).
    #    A refused host is reported REFUSED with its reasons, as deploy/verify.py reports it.
    try:
        spec = spec_for_host(host)
    except SpecError:
        spec = None  # refused by the preflight: nothing to probe, its refusal is the verdict
    verify_after_run(spec)
