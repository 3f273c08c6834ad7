"""Training launch: a ``~/launch-ppo.sh`` per host, right for its GPUs.

    pyinfra -y inventories/lab.py deploy/training.py

Runs after deploy/python.py (the training user, the conda env and verl exist). Per host:
validated spec -> GPU facts (PCI ids; nvidia-smi memory when the driver answers; with a Ray head
in the inventory, every member's PCI GPUs: ``p40fleet.launch.cluster_shape``) -> launch plan
(``p40fleet.launch``: profile overrides and the sizing rule) -> the script in the training
user's home. Changes nothing when the script is already right. A host that cannot get a script
is refused on its own; the others go on.
"""

from __future__ import annotations

from pyinfra import host, inventory, state
from pyinfra.context import ctx_host

from facts.gpu import NvidiaSmi, PciGpus
from operations import launch, ray_cluster, training_user
from operations.preflight import refuse, refused_hosts, validated_spec
from p40fleet.launch import ClusterShape, LaunchError, LaunchPlan, cluster_shape, plan_launch
from p40fleet.spec import StackSpec


def gpu_memory_mib(gpu_count: int) -> list[int | None]:
    """nvidia-smi's ``memory.total`` per GPU, or ``[]`` when it does not answer for all of them."""
    smi = host.get_fact(NvidiaSmi)
    if not smi.ok or len(smi.gpus) != gpu_count:
        return []
    return [gpu.memory_mib for gpu in smi.gpus]


def cluster() -> ClusterShape:
    """The Ray cluster's shape: every inventory host runs deploy/ray.py's member, except the
    hosts this run refused or could not reach (they run no member)."""
    refused = refused_hosts()
    members = [h for h in inventory if h in inventory.get_active_hosts() and h.name not in refused]
    nodes = {}
    for member in members:
        with ctx_host.use(member):
            nodes[member.name] = list(member.get_fact(PciGpus))
    return cluster_shape(nodes)


def launch_plan(spec: StackSpec) -> LaunchPlan | None:
    """This host's plan, or None after queueing a refusal that says why."""
    gpus = list(host.get_fact(PciGpus))
    try:
        shape = cluster() if ray_cluster.configured(spec) else None
        return plan_launch(spec, gpus, smi_memory_mib=gpu_memory_mib(len(gpus)), cluster=shape)
    except LaunchError as exc:
        refuse(
            name="Refuse: launch script",
            step="launch script",
            reason=str(exc),
            remedy="run deploy/facts.py and fix what it reports",
        )
        return None


def deploy(spec: StackSpec) -> None:
    plan = launch_plan(spec)
    if plan is None:
        return
    host.log(f"launch: {plan.sizing.describe()}")
    launch.launch_script(
        name=f"PPO launch script ~{spec.user.name}/{launch.SCRIPT_NAME} ({plan.profile})",
        plan=plan,
        user=spec.user.name,
        home=spec.user.home,
        user_queued=host.name in training_user.queued_hosts(state),
    )


_spec = validated_spec()
if _spec is not None:
    deploy(_spec)
