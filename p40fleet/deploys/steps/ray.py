"""Ray cluster: one head and the training nodes joining it, supervised by systemd.

    pyinfra -y inventories/lab.py deploy/ray.py     # after deploy/python.py (ray is in the env)

The head is ``stack.ray.head`` or the one host of the inventory group ``ray_head``; ports and
addresses come from ``stack.ray`` (p40fleet/spec/pins.py). The members are the cluster plan's
(``operations.run.ray_cluster.membership``: the nodes that train on the most GPUs, the same plan as
deploy/training.py's scripts, also under ``--limit``). Per host: validated spec -> plan (head
or worker, ``ray start ... --block`` from the env; ``--num-gpus=0`` on a head that is not a
training node; a simulated training node offers its GPUs as fake GPUs and ``cpu`` resources,
what verl's CPU step asks for) -> ``p40fleet-ray.service`` written, enabled, running; a host
the plan leaves out runs none (an earlier unit is removed). A member already running this
plan is left alone: a second run changes nothing.
systemd restarts a member that dies and starts it at boot, so a rebooted worker rejoins.
Check the cluster with ``python -m p40fleet.verify INVENTORY`` (ray service, cluster, GPUs).
"""

from __future__ import annotations

from pyinfra import host

from p40fleet.deploys.steps import preflight as preflight_steps
from p40fleet.operations import ray
from p40fleet.operations.refuse import refuse
from p40fleet.operations.run import ray_cluster
from p40fleet.operations.run.spec import validated_spec
from p40fleet.ray import RayError
from p40fleet.runtime.included import included
from p40fleet.spec import StackSpec


def join_cluster(spec: StackSpec) -> None:
    """This host's part of the cluster plan: head, worker, left out, or refused."""
    members = ray_cluster.membership(spec)
    for note in members.notes:
        host.log(f"ray cluster: {note}")
    if members.shape is None:
        refuse(name="Refuse: ray cluster", step="ray cluster", reason=members.problem,
               remedy="run deploy/ray.py without --limit, with every host reachable")  # fmt: skip
        return
    if not members.runs_member(host.name):
        why = members.shape.why_left_out(host.name) or "not a member"
        ray.ray_left_out(name=f"No Ray member here ({why})", why=why)
        return
    try:
        plan = ray_cluster.plan_for_host(spec, members)
    except RayError as exc:
        refuse(name="Refuse: ray cluster", step="ray cluster", reason=exc.cause, remedy=exc.fix)
        return
    host.log(f"ray: {plan.role} of {plan.address}")
    ray.ray_member(name=f"Ray {plan.role} ({plan.address}) as p40fleet-ray.service", plan=plan)


def run() -> None:
    """The deploy's steps for the current host (``deploy/ray.py`` calls it)."""
    # Refusals first (OS, GPUs, spec, space, mirror), also when this deploy runs alone; idempotent.
    with included("deploy/preflight.py"):
        preflight_steps.run()
    _spec = validated_spec()
    if _spec is None:
        return

    join_cluster(_spec)
