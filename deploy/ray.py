"""Ray cluster: one head, every other host joining it, supervised by systemd.

    pyinfra -y inventories/lab.py deploy/ray.py     # after deploy/python.py (ray is in the env)

The head is ``stack.ray.head`` or the one host of the inventory group ``ray_head``; ports and
addresses come from ``stack.ray`` (p40fleet/spec/pins.py). Per host: validated spec -> plan (head or
worker, ``ray start ... --block`` from the env) -> ``p40fleet-ray.service`` written, enabled,
running. A member already running this plan is left alone: a second run changes nothing.
systemd restarts a member that dies and starts it at boot, so a rebooted worker rejoins.
Check the cluster with ``python -m p40fleet.verify INVENTORY`` (ray service, cluster, GPUs).
"""

from __future__ import annotations

from pyinfra import host, local

from operations import ray, ray_cluster
from operations.refuse import refuse, validated_spec
from p40fleet.ray import RayError
from p40fleet.spec import StackSpec


def deploy(spec: StackSpec) -> None:
    try:
        plan = ray_cluster.plan_for_host(spec)
    except RayError as exc:
        refuse(name="Refuse: ray cluster", step="ray cluster", reason=exc.cause, remedy=exc.fix)
        return
    host.log(f"ray: {plan.role} of {plan.address}")
    ray.ray_member(name=f"Ray {plan.role} ({plan.address}) as p40fleet-ray.service", plan=plan)


# Refusals first (OS, GPUs, spec, space, mirror), also when this deploy runs alone; idempotent.
local.include("deploy/preflight.py")
_spec = validated_spec()
if _spec is not None:
    deploy(_spec)
