"""Who is in the Ray cluster, from the inventory, the spec and what the last full run learnt
(no operation here).

The head: ``stack.ray.head``, else the one host of the inventory group ``ray_head``. The
members dial ``stack.ray.head_address``, else the head's ``ssh_hostname``, else its name.

Membership (:func:`membership`, once per run): every inventory host's PCI GPUs decide who
trains (``p40fleet.launch.cluster_shape``: the per-node count and the nodes that train on the
most GPUs). A host in this run is read from its own survey; a host outside it (``--limit``) or
unreachable is read from the controller's record of the last full run
(``p40fleet.ray.members_path()``: ``$P40FLEET_CACHE/ray-members.json``), so a limited run plans
the same cluster a full one does. A host in neither: no plan ("never silently a smaller
cluster"), every host's launch script and Ray member are left as they are and the run says
why. A run that reached every inventory host writes the record (when it changed).
The Ray units follow the same membership: the head (``--num-gpus=0`` when it is not a training
node) and the training nodes run a member; a host left out runs none. verify expects
``stack.ray.nodes`` nodes, else the head and the training nodes.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyinfra import host, inventory
from pyinfra.api.exceptions import NoGroupError

from p40fleet.facts.collective import CollectiveRunFact, CollectiveTargets
from p40fleet.facts.env import env_python
from p40fleet.facts.gpu import PciGpus
from p40fleet.facts.ray import RayStatus
from p40fleet.facts.smoke import ClusterSmokeStep, ClusterSmokeTargets
from p40fleet.facts.survey import ask
from p40fleet.launch import ClusterShape, LaunchError, cluster_shape
from p40fleet.operations.run.survey import survey_host
from p40fleet.operations.training import script_path as launch_script_path
from p40fleet.ray import (
    HEAD_GROUP,
    RayError,
    RayPlan,
    choose_head,
    host_port,
    load_members,
    members_path,
    plan_ray,
    ray_cli,
    save_members,
)
from p40fleet.run_record import run_record
from p40fleet.spec import SpecError, StackSpec, spec_for_host
from p40fleet.verification import collective, smoke
from p40fleet.verification.check import FAIL, SKIP, Check, simulated_in_inventory
from p40fleet.verification.checks.ray import left_out_checks, ray_checks

__all__ = [
    "Membership",
    "cluster_smoke_checks",
    "collective_checks",
    "configured",
    "expected_nodes",
    "head_group",
    "member_gpus",
    "membership",
    "plan_for_host",
    "verify_checks",
]

_FULL_RUN = "run the deploy without --limit, with every inventory host reachable"


def _member(member: Any) -> tuple[list | None, str]:
    """A member's PCI GPUs from its own survey, or None and why its spec or GPUs refuse it."""
    try:
        member_spec = spec_for_host(member)
    except SpecError as exc:
        return None, f"spec: {' '.join(str(exc).split())}"
    survey_host(member, member_spec)
    gpus = list(ask(member, PciGpus))
    summary = member_spec.gpu_summary(gpus)
    return (gpus, "") if summary.ok else (None, f"GPUs {summary.gpus_str}: {summary.refused}")


def member_gpus(member: Any) -> list | None:
    """A member's PCI GPUs, from its own survey (asked once per run; facts do not use the host
    in context). None when its own spec or GPUs refuse it: it is left out of the cluster."""
    return _member(member)[0]


@dataclass(frozen=True)
class Membership:
    """The cluster this run plans: its shape (None: no plan, ``problem`` says why), the head,
    its address, and ``notes`` on where the facts came from."""

    shape: ClusterShape | None
    head: str = ""
    address: str = ""
    problem: str = ""
    notes: tuple[str, ...] = ()

    def trains(self, name: str) -> bool:
        return self.shape is not None and name in self.shape.members

    def runs_member(self, name: str) -> bool:
        """The Ray units follow the plan: the head and the training nodes run one."""
        return name == self.head or self.trains(name)


def _head_address(head: str, spec: StackSpec) -> str:
    return spec.ray.head_address or inventory.get_host(head).data.get("ssh_hostname") or head


def membership(spec: StackSpec) -> Membership:
    """The cluster of this run (computed once per pyinfra state: every host plans the same)."""
    record = run_record(inventory.state)
    if record.ray_membership is None:
        record.ray_membership = _membership(spec)
    return record.ray_membership


def _membership(spec: StackSpec) -> Membership:
    try:
        head = choose_head(spec, head_group(), (h.name for h in inventory))
    except RayError as exc:
        return Membership(None, problem=f"{exc.cause} ({exc.fix})")
    address = host_port(_head_address(head, spec), spec.ray.port)
    cluster = f"{head}@{address}"
    active = {h.name for h in inventory.get_active_hosts()}
    learnt = None
    gpus: dict[str, list[int]] = {}
    refused: dict[str, str] = {}
    recorded: list[str] = []
    unknown: list[str] = []
    for member in inventory:
        name = member.name
        if name in active:
            found, why = _member(member)
            if found is None:
                refused[name] = why
            else:  # device ids: the same as a record's, so both plan the same
                gpus[name] = [getattr(g, "device_id", g) for g in found]
            continue
        learnt = learnt or load_members(cluster)
        if learnt is not None and name in learnt.gpus:
            gpus[name] = list(learnt.gpus[name])
        elif learnt is not None and name in learnt.refused:
            refused[name] = learnt.refused[name]
        else:
            unknown.append(name)
            continue
        recorded.append(name)
    record = members_path()
    if unknown:
        return Membership(
            None,
            head,
            address,
            problem=f"the cluster's members {', '.join(unknown)} are not in this run (--limit) "
            f"or unreachable, and {record} has no record of them from a full run: the cluster "
            f"is not planned from a part of it ({_FULL_RUN})",
        )
    notes = []
    if recorded:
        when = learnt.learnt if learnt is not None else "?"
        notes.append(f"{', '.join(recorded)} not in this run: sized from the last full run "
                     f"({record}, learnt {when})")  # fmt: skip
    else:
        if save_members(cluster, gpus, refused):
            notes.append(f"recorded the members' GPUs in {record}")
    try:
        shape = cluster_shape(gpus, refused=refused, name=f"headed by {head} ({address})")
    except LaunchError as exc:
        return Membership(None, head, address, problem=str(exc), notes=tuple(notes))
    return Membership(shape, head, address, notes=tuple(notes))


def head_group() -> list[str]:
    try:
        return [member.name for member in inventory.get_group(HEAD_GROUP)]
    except NoGroupError:
        return []


def configured(spec: StackSpec) -> bool:
    """True when this inventory has a Ray cluster (a head chosen one way or the other)."""
    return spec.ray.head is not None or bool(head_group())


#: The custom resource verl 0.5.0's CPU step asks every node's placement group for (a resource
#: named after the device: single_controller/ray/base.py:110-117); its GPU count
#: (ray_trainer.py:119-135) is met by as many fake GPUs.
CPU_RESOURCE = "cpu"


def plan_for_host(spec: StackSpec, members: Membership | None = None) -> RayPlan:
    """This host's plan; raises :class:`p40fleet.ray.RayError` when no head can be chosen.
    ``members``: the run's membership; a head that is not a training node offers Ray no GPU.
    A training node the inventory marks simulated (no GPU for Ray to detect) offers its PCI
    GPUs as fake GPUs and as many ``cpu`` resources, so the cluster's CPU smoke step
    (``verify --smoke``, gloo) can place one worker per GPU on it; a real host offers what
    Ray detects."""
    head = choose_head(spec, head_group(), (h.name for h in inventory))
    address = _head_address(head, spec)
    own_ip = _ip_or_none(host.data.get("ssh_hostname"))
    gpus = 0 if members is not None and host.name == head and not members.trains(head) else None
    resources = None
    shape = members.shape if members is not None else None
    if shape is not None and host.name in shape.members and simulated_in_inventory(host.data):
        gpus = dict(shape.node_gpus)[host.name]
        resources = {CPU_RESOURCE: gpus}
    return plan_ray(spec, host.name, head, address, node_ip=own_ip, num_gpus=gpus,
                    resources=resources)  # fmt: skip


def _ip_or_none(value: object) -> str | None:
    """``value`` when it is an IP address (the host's address on the cluster network)."""
    try:
        return str(ipaddress.ip_address(str(value)))
    except ValueError:
        return None


def expected_nodes(spec: StackSpec, members: Membership | None = None) -> int:
    """``stack.ray.nodes``, else the head and the training nodes (else every inventory host)."""
    if spec.ray.nodes:
        return spec.ray.nodes
    if members is None or members.shape is None:
        return len(list(inventory))
    return len({members.head, *members.shape.members})


def verify_checks(spec: StackSpec) -> list[Check]:
    """The Ray checks of this host for deploy/verify.py; none when no cluster is configured."""
    if not configured(spec):
        return []
    members = membership(spec)
    if members.shape is None:
        return [Check("ray", FAIL, members.problem, _FULL_RUN)]
    try:
        plan = plan_for_host(spec, members)
    except RayError as exc:
        return [Check("ray", FAIL, exc.cause, exc.fix)]
    probe = ask(host, RayStatus, ray=ray_cli(spec), address=plan.address,
                          temp_dir=spec.ray.temp_dir, user=spec.user.name)  # fmt: skip
    if not members.runs_member(host.name):
        return left_out_checks(probe, members.shape.why_left_out(host.name) or "not a member")
    pci = len(list(ask(host, PciGpus)))
    return ray_checks(
        probe,
        address=plan.address,
        nodes=expected_nodes(spec, members),
        pci_gpus=pci,
        ray_gpus=pci if members.trains(host.name) else 0,  # a head that does not train: 0
        simulated=simulated_in_inventory(host.data),
    )


def cluster_smoke_checks(spec: StackSpec, checks: Sequence[Check] = ()) -> list[Check]:
    """``verify --smoke`` on a Ray cluster: the head's ``smoke step (cluster)`` row, ONE PPO
    step over the cluster's plan run on the head against the fleet's Ray cluster (a fact; CPU
    with gloo on simulated hosts), or a SKIP saying why not (``checks``: the head's own, its
    ``smoke step`` among them: ``smoke.cluster_skip``). Nothing on another host, without a
    plan (``ray`` FAILs then) or with one training node (its own step is it)."""
    if not configured(spec):
        return []
    members = membership(spec)
    shape = members.shape
    if shape is None or host.name != members.head or shape.nnodes < 2:
        return []
    skipped = smoke.cluster_skip(checks, members.head)
    if skipped is not None:
        return [skipped]
    try:
        timeout_s = smoke.timeout_from_data(host.data.get(smoke.SMOKE_TIMEOUT_DATA))
    except ValueError as exc:
        return [Check(smoke.CLUSTER_CHECK, FAIL, str(exc), "set it to whole seconds (or leave "
                      "it out)")]  # fmt: skip
    targets = ClusterSmokeTargets(
        user=spec.user.name,
        python=env_python(spec.env.conda_prefix, spec.env.name),
        launch_script=launch_script_path(spec.user.home),
        verl_checkout=spec.env.verl_checkout,
        verl_ref=spec.verl.ref,
        address=members.address,
        head_host=_head_address(members.head, spec),
        members=tuple((name, _member_address(name)) for name in shape.members),
        gpus_per_node=shape.gpus_per_node,
        timeout_s=timeout_s,
        simulated=simulated_in_inventory(host.data),
    )
    run = ask(host, ClusterSmokeStep, targets=targets)
    return [smoke.cluster_check(run, head=members.head, members=shape.members,
                                gpus_per_node=shape.gpus_per_node,
                                model=spec.training.model.name, timeout_s=timeout_s)]  # fmt: skip


def _member_address(name: str) -> str:
    """The address Ray knows a member by: its ``stack.ray.node_ip``, else its ``ssh_hostname``,
    else its name (the head's driver resolves it)."""
    member = inventory.get_host(name)
    try:
        node_ip = spec_for_host(member).ray.node_ip
    except SpecError:
        node_ip = None
    return str(node_ip or member.data.get("ssh_hostname") or name)


def collective_checks(spec: StackSpec) -> list[Check]:
    """``verify --collective``: the all-reduce over the training nodes, run from the head (one
    fact there); the head's entry carries one check per node and the group's. A training node
    that is not the head adds nothing (or a SKIP when the head is not in this run)."""
    if not configured(spec):
        return [Check(collective.CHECK, SKIP, "no Ray cluster in this inventory (stack.ray.head "
                      "or the ray_head group): no nodes to all-reduce over")]  # fmt: skip
    members = membership(spec)
    if members.shape is None:
        return [Check(collective.CHECK, FAIL, f"no cluster plan: {members.problem}", _FULL_RUN)]
    if host.name != members.head:
        active = {h.name for h in inventory.get_active_hosts()}
        if members.trains(host.name) and members.head not in active:
            return [Check(collective.CHECK, SKIP, f"runs on the Ray head {members.head}, which "
                          "is not in this run (--limit)")]  # fmt: skip
        return []
    try:
        timeout_s = collective.timeout_from_data(host.data.get(collective.COLLECTIVE_TIMEOUT_DATA))
    except ValueError as exc:
        fix = "set it to whole seconds (or leave it out)"
        return [Check(collective.CHECK, FAIL, str(exc), fix)]
    targets = CollectiveTargets(
        user=spec.user.name,
        python=env_python(spec.env.conda_prefix, spec.env.name),
        address=members.address,
        store_host=_head_address(members.head, spec),
        port=spec.ray.collective_port,
        members=tuple((name, _member_address(name)) for name in members.shape.members),
        timeout_s=timeout_s,
    )
    run = ask(host, CollectiveRunFact, targets=targets)
    return collective.collective_checks(
        run, head=host.name, floor_gbs=spec.ray.collective_min_busbw_gbs, timeout_s=timeout_s
    )
