"""The Ray cluster member of a host: a systemd unit running ``ray start ... --block``.

The unit (``files/ray.service.j2``, rendered from :class:`p40fleet.ray.RayPlan`) carries the
head's address, so "a running member of the right cluster" is: the unit file is the one this
plan renders, and the unit is running and enabled. Then nothing is done. Otherwise pyinfra's
own operations do the work: ``files.template`` writes the unit, ``systemd.service`` reloads,
(re)starts and enables it. systemd restarts the member when it dies (``Restart=always``) and
starts it at boot (``WantedBy=multi-user.target``).
"""

from __future__ import annotations

from pathlib import Path

from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.facts.files import File
from pyinfra.operations import files, systemd

from facts.ray import HasSystemd
from facts.survey import ask
from operations.refuse import refuse
from p40fleet.ray import UNIT_NAME, UNIT_PATH, RayPlan

__all__ = ["TEMPLATE", "ray_left_out", "ray_member"]

TEMPLATE = str(Path(__file__).resolve().parent.parent / "files" / "ray.service.j2")
STEP = "ray cluster"


@operation()
def ray_member(plan: RayPlan):
    """
    Make this host a member of the Ray cluster of ``plan`` (head or worker), supervised by
    systemd as ``p40fleet-ray.service``, enabled at boot.

    + plan: the host's Ray plan (``p40fleet.ray.plan_ray``)

    Refuses the host (changes nothing) when systemd does not run it or when the env's ``ray``
    CLI is missing (deploy/python.py installs it with verl's pinned requirements).
    """
    if not ask(host, HasSystemd):
        yield from refuse._inner(
            step=STEP,
            reason="systemd is not the init system here (/run/systemd/system is missing)",
            remedy="run the Ray member on a host booted with systemd (Ubuntu 20.04 is)",
        )
        return
    ray = plan.argv[0]
    if not ask(host, File, path=ray):
        yield from refuse._inner(
            step=STEP,
            reason=f"the env's ray CLI {ray} is missing",
            remedy="run deploy/python.py first (it installs ray with verl's pinned requirements)",
        )
        return
    unit = list(
        files.template._inner(
            src=TEMPLATE,
            dest=UNIT_PATH,
            user="root",
            group="root",
            mode="644",
            **plan.template_vars(),
        )
    )
    yield from unit
    # A new unit file: reload it, and restart a member that runs the old one.
    yield from systemd.service._inner(
        service=UNIT_NAME,
        running=True,
        restarted=bool(unit),
        enabled=True,
        daemon_reload=bool(unit),
    )


@operation()
def ray_left_out(why: str):
    """
    Run no Ray member here: this host is not in the cluster's plan (it trains alone).

    + why: why the plan leaves it out (for the log)

    A unit of an earlier plan is stopped, disabled and removed (pyinfra's own operations);
    no unit: nothing to do.
    """
    if not ask(host, File, path=UNIT_PATH):
        host.noop(f"no Ray member here: left out of the cluster ({why})")
        return
    yield from systemd.service._inner(service=UNIT_NAME, running=False, enabled=False)
    yield from files.file._inner(path=UNIT_PATH, present=False)
    yield StringCommand("systemctl", "daemon-reload")
