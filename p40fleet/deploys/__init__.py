"""The deploys as pyinfra ``@deploy`` functions, for another repo's deploy file:

    from p40fleet.deploys import full

    full()  # with that repo's inventory: pyinfra INVENTORY deploy.py

Each runs the same steps as the ``deploy/*.py`` entry point of the same name
(``p40fleet/deploys/steps/<name>.py``); pyinfra names their operations
``p40fleet <name> | <operation>``, a layer's as the entry point names it:
``p40fleet full | deploy/system.py | Blacklist nouveau``. Each layer starts with the
preflight's refusals, so a layer also runs alone (``system()`` after a reinstall, ``verify()``
on its own); ``full()`` runs
preflight, system, python and training, then verify's checks once the last operation ran.
Global arguments (``_sudo``, ``_if``, …) given to a function apply to all its operations.
"""

from __future__ import annotations

from pyinfra.api import deploy

__all__ = ["facts", "full", "preflight", "python", "ray", "system", "training", "uninstall",
           "verify"]  # fmt: skip


@deploy("p40fleet full")
def full() -> None:
    """Provision the host: preflight, system, python, training, then verify."""
    from p40fleet.deploys.steps import full as steps

    steps.run()


@deploy("p40fleet preflight")
def preflight() -> None:
    """Every refusal decided before any change (spec, GPUs, OS, locks, space, mirror)."""
    from p40fleet.deploys.steps import preflight as steps

    steps.run()


@deploy("p40fleet system")
def system() -> None:
    """Nouveau out, NVIDIA driver, CUDA toolkit, cuDNN hard-linked into it."""
    from p40fleet.deploys.steps import system as steps

    steps.run()


@deploy("p40fleet python")
def python() -> None:
    """Training user, Miniconda and the env, torch, Apex, verl patched."""
    from p40fleet.deploys.steps import python as steps

    steps.run()


@deploy("p40fleet training")
def training() -> None:
    """The model and data staged, the launch script sized to the host."""
    from p40fleet.deploys.steps import training as steps

    steps.run()


@deploy("p40fleet ray")
def ray() -> None:
    """The fleet's Ray cluster: one unit per member of the cluster plan."""
    from p40fleet.deploys.steps import ray as steps

    steps.run()


@deploy("p40fleet verify")
def verify() -> None:
    """Verify the host as it is now; changes nothing (a failed check fails the host)."""
    from p40fleet.deploys.steps import verify as steps

    steps.run()


@deploy("p40fleet facts")
def facts() -> None:
    """The GPU and host facts of every host, printed as one fleet table; changes nothing."""
    from p40fleet.deploys.steps import facts as steps

    steps.run()


@deploy("p40fleet uninstall")
def uninstall() -> None:
    """Remove what the deploys installed (the training user's home kept by default)."""
    from p40fleet.deploys.steps import uninstall as steps

    steps.run()
