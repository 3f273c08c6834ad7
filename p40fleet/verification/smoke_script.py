"""The smoke step's script: ``files/verify-smoke.sh.j2`` rendered for one host (no pyinfra).

``facts.smoke.SmokeStep`` runs it on a host as the training user; a GPU harness can run the same
text by hand (``sh JOB no``), so the device run and verify share one code path.
:func:`render_cluster_job`: the same template for the Ray head's step over the cluster's plan
(``facts.smoke.ClusterSmokeStep``), with ``files/verify-smoke-cluster.py`` as its helper.
"""

from __future__ import annotations

import json
import shlex
from typing import NamedTuple

from p40fleet.shell_template import shell_template
from p40fleet.verification import smoke
from p40fleet.verl_patches import APPLIER_PATH, VerlPatchError, lab_cpu_ruleset_json

__all__ = [
    "CLUSTER_DRIVER",
    "RAY_PORT",
    "SMOKE_TEMPLATE",
    "ClusterSmokeTargets",
    "SmokeTargets",
    "cluster_config",
    "render_cluster_job",
    "render_job",
]

SMOKE_TEMPLATE = APPLIER_PATH.parent / "verify-smoke.sh.j2"
CLUSTER_DRIVER = APPLIER_PATH.parent / "verify-smoke-cluster.py"
#: The GCS port of the Ray head a simulated host's CPU step starts (not Ray's 6379: a Ray
#: cluster of the fleet may hold that one).
RAY_PORT = 26379
#: Lines of the trainer's log the script sends back (the check keeps the last ones).
SCRIPT_LOG_LINES = 60


class SmokeTargets(NamedTuple):
    """What one smoke step runs: the training user, the env's python, the launch script, the
    verl checkout (whose package a CPU step copies), the verl ref (its lab-cpu rules), the
    host's GPUs per node (its launch plan), the bound in seconds and whether the inventory
    marks the host simulated (only then may the lab's marker make it a CPU step). Hashable: a
    memo key."""

    user: str
    python: str
    launch_script: str
    verl_checkout: str
    verl_ref: str
    gpus: int
    timeout_s: int
    simulated: bool = False


class ClusterSmokeTargets(NamedTuple):
    """What the Ray head's cluster step runs: the training user, the env's python, the head's
    launch script, its verl checkout and ref (the lab-cpu copy on simulated hosts), the Ray
    cluster's GCS address, the head's own address (its raylet's), the plan's members as
    ``(name, address)``, its GPUs per node, the bound in seconds and whether the inventory marks
    the head simulated. Hashable."""

    user: str
    python: str
    launch_script: str
    verl_checkout: str
    verl_ref: str
    address: str
    head_host: str
    members: tuple[tuple[str, str], ...]
    gpus_per_node: int
    timeout_s: int
    simulated: bool = False


def _words(overrides: list[str]) -> str:
    return " ".join(smoke.shell_word(o) for o in overrides)


def _rules(ref: str) -> str:
    try:
        return lab_cpu_ruleset_json(ref)
    except VerlPatchError:  # no CPU rules for this ref: the applier says so on a simulated host
        return '{"format": 1, "ref": "none", "profile": "lab-cpu", "rules": []}'


def _shared(targets: SmokeTargets | ClusterSmokeTargets) -> dict[str, object]:
    """What the single-host and the cluster script both render: the user's env and launch
    script, the verl checkout with its lab-cpu rules and the applier, the bound."""
    return {
        "python": targets.python,
        "launch_script": targets.launch_script,
        "verl_checkout": targets.verl_checkout.rstrip("/") or "/",
        "timeout_s": int(targets.timeout_s),
        "log_lines": SCRIPT_LOG_LINES,
        "applier": APPLIER_PATH.read_text().rstrip("\n"),
        "rules_json": _rules(targets.verl_ref).rstrip("\n"),
    }


def render_job(targets: SmokeTargets) -> str:
    """The script the training user runs (``$1``: ``yes`` on a simulated host: the CPU step)."""
    return shell_template(SMOKE_TEMPLATE).render(
        cluster=False,
        **_shared(targets),
        cpu_overrides=_words(smoke.smoke_overrides(simulated=True, gpus=1)),
        gpu_overrides=_words(smoke.smoke_overrides(simulated=False, gpus=targets.gpus)),
        cpu_ray_args=" ".join(shlex.quote(a) for a in smoke.cpu_ray_start_args(RAY_PORT)),
    )


def cluster_config(targets: ClusterSmokeTargets) -> dict:
    """The helper's config (``cluster.json`` in the scratch dir)."""
    for name, address in targets.members:
        if not name or not address or any(c.isspace() for c in name + address):
            raise ValueError(f"member {name!r} at {address!r}: expected a name and an address")
    if len(targets.members) < 2:
        raise ValueError("a cluster step needs 2 or more members")
    return {
        "address": targets.address,
        "head_host": targets.head_host,
        "members": [list(m) for m in targets.members],
        "gpus_per_node": int(targets.gpus_per_node),
        "join_s": 60,
    }


def render_cluster_job(targets: ClusterSmokeTargets) -> str:
    """The Ray head's script for one step over the cluster's plan (``$1``: ``yes`` on a
    simulated head: CPU with gloo; stdin: the cluster's token line)."""
    nnodes, per_node = len(targets.members), int(targets.gpus_per_node)
    return shell_template(SMOKE_TEMPLATE).render(
        cluster=True,
        **_shared(targets),
        cpu_overrides=_words(
            smoke.cluster_overrides(simulated=True, nnodes=nnodes, gpus_per_node=per_node)
        ),
        gpu_overrides=_words(
            smoke.cluster_overrides(simulated=False, nnodes=nnodes, gpus_per_node=per_node)
        ),
        address=targets.address,
        cluster_json=json.dumps(cluster_config(targets), sort_keys=True),
        cluster_driver=CLUSTER_DRIVER.read_text().rstrip("\n"),
    )
