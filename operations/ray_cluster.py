"""Who is in the Ray cluster, from the inventory and the spec (no operation here).

The head: ``stack.ray.head``, else the one host of the inventory group ``ray_head``. The
members dial ``stack.ray.head_address``, else the head's ``ssh_hostname``, else its name.
verify expects ``stack.ray.nodes`` nodes, else every host of the inventory.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from pyinfra import host, inventory
from pyinfra.api.exceptions import NoGroupError

from facts.gpu import PciGpus
from facts.ray import RayStatus
from facts.survey import ask
from operations.survey import survey_host
from p40fleet.launch import ClusterShape, cluster_shape
from p40fleet.ray import HEAD_GROUP, RayError, RayPlan, choose_head, plan_ray, ray_cli
from p40fleet.spec import SpecError, StackSpec, spec_for_host
from p40fleet.verification.check import FAIL, Check
from p40fleet.verification.ray_checks import ray_checks

__all__ = [
    "configured",
    "expected_nodes",
    "head_group",
    "member_gpus",
    "plan_for_host",
    "shape_of",
    "verify_checks",
]


def member_gpus(member: Any) -> list | None:
    """A member's PCI GPUs, from its own survey (asked once per run; facts do not use the host
    in context). None when its own spec or GPUs refuse it: its preflight refuses it and it runs
    no member, whether or not its deploy code has run yet (pyinfra prepares hosts side by side,
    so ``operations.refuse.refused_hosts`` may not know it yet)."""
    try:
        member_spec = spec_for_host(member)
    except SpecError:
        return None
    survey_host(member, member_spec)
    gpus = list(ask(member, PciGpus))
    return gpus if member_spec.gpu_summary(gpus).ok else None


def shape_of(members: Iterable[Any]) -> ClusterShape:
    """The Ray cluster's shape over ``members`` (inventory hosts), the refused ones left out."""
    nodes = {member.name: member_gpus(member) for member in members}
    return cluster_shape({name: gpus for name, gpus in nodes.items() if gpus is not None})


def head_group() -> list[str]:
    try:
        return [member.name for member in inventory.get_group(HEAD_GROUP)]
    except NoGroupError:
        return []


def configured(spec: StackSpec) -> bool:
    """True when this inventory has a Ray cluster (a head chosen one way or the other)."""
    return spec.ray.head is not None or bool(head_group())


def plan_for_host(spec: StackSpec) -> RayPlan:
    """This host's plan; raises :class:`p40fleet.ray.RayError` when no head can be chosen."""
    head = choose_head(spec, head_group(), (h.name for h in inventory))
    address = spec.ray.head_address or inventory.get_host(head).data.get("ssh_hostname") or head
    own_ip = _ip_or_none(host.data.get("ssh_hostname"))
    return plan_ray(spec, host.name, head, address, node_ip=own_ip)


def _ip_or_none(value: object) -> str | None:
    """``value`` when it is an IP address (the host's address on the cluster network)."""
    try:
        return str(ipaddress.ip_address(str(value)))
    except ValueError:
        return None


def expected_nodes(spec: StackSpec) -> int:
    return spec.ray.nodes or len(list(inventory))


def verify_checks(spec: StackSpec) -> list[Check]:
    """The Ray checks of this host for deploy/verify.py; none when no cluster is configured."""
    if not configured(spec):
        return []
    try:
        plan = plan_for_host(spec)
    except RayError as exc:
        return [Check("ray", FAIL, exc.cause, exc.fix)]
    probe = ask(host, RayStatus, ray=ray_cli(spec), address=plan.address,
                          temp_dir=spec.ray.temp_dir, user=spec.user.name)  # fmt: skip
    return ray_checks(
        probe,
        address=plan.address,
        nodes=expected_nodes(spec),
        pci_gpus=len(list(ask(host, PciGpus))),
    )
