"""Training: the model and data a host trains on, and a ``~/launch-ppo.sh`` right for its GPUs.

    pyinfra -y inventories/lab.py deploy/training.py

Runs after deploy/python.py (the training user, the conda env and verl exist). Per host:
validated spec -> 1. the model and 2. the data of ``stack.training``, each unpacked once from
its sha256-pinned archive when it has one (``operations.training.stage``: a re-run downloads
nothing) -> 3. the launch plan (``operations.training.host_plan``: GPU facts, the staged model's
config.json, with a Ray head in the inventory the cluster plan:
``operations.run.ray_cluster.membership``, every inventory host's PCI GPUs, a host outside this run
from the last full run's record; ``p40fleet.launch``) -> the script in the training user's
home (a host the cluster leaves out: a script for its own GPUs). Changes nothing when all of
it is already right. A host that cannot get a script is refused on its own; the others go on.
No cluster plan (a member outside the run with no record): every script is left as it is.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyinfra import host, state

from p40fleet.deploys.steps import preflight as preflight_steps
from p40fleet.launch import LaunchPlan
from p40fleet.operations import training, training_user
from p40fleet.operations.refuse import refuse
from p40fleet.operations.run import ray_cluster
from p40fleet.operations.run.spec import validated_spec
from p40fleet.runtime.included import included
from p40fleet.training import staged_dir


def run() -> None:
    """The deploy's steps for the current host (``deploy/training.py`` calls it)."""
    # Refusals first (OS, GPUs, spec, space, mirror), also when this deploy runs alone; idempotent.
    # The steps run at the file's top level, as in deploy/system.py.
    with included("deploy/preflight.py"):
        preflight_steps.run()
    spec = validated_spec()
    if spec is None:
        return

    # 1. The model, then 2. the data: each unpacked once from its sha256-pinned archive.
    for which in ("model", "data"):
        archive = getattr(spec.training, which).archive
        source = f"from {archive.filename}" if archive else "(no archive: checked only)"
        training.stage(
            name=f"Training {which} {staged_dir(spec, which)} {source}", which=which, spec=spec
        )

    # 3. The launch script, planned for this host's GPUs (and the Ray cluster's, with a head).
    members = ray_cluster.membership(spec) if ray_cluster.configured(spec) else None
    for note in members.notes if members is not None else ():
        host.log(f"ray cluster: {note}")
    if members is not None and members.shape is None:
        # never a script for a part of the cluster: the one there is left as it is
        refuse(
            name=f"Refuse: PPO launch script ~{spec.user.name}/{training.SCRIPT_NAME}",
            step="launch script",
            reason=f"no cluster plan, the script is left as it is: {members.problem}",
            remedy="run deploy/training.py without --limit, with every inventory host reachable",
        )
    else:
        shape = members.shape if members is not None else None

        def make_plan(model_config: Mapping | None) -> LaunchPlan:
            return training.host_plan(spec, model_config=model_config, cluster=shape)

        training.launch_script(
            name=f"PPO launch script ~{spec.user.name}/{training.SCRIPT_NAME}",
            spec=spec,
            make_plan=make_plan,
            user_queued=host.name in training_user.queued_hosts(state),
            model_queued=training.needs_staging(spec, "model"),
        )
