"""Verify checks of the Ray cluster: a :class:`p40fleet.ray.RayProbe` -> PASS / FAIL / SKIP.

Pure functions. Each member checks its own unit, that the cluster at the head's address has
the expected number of active nodes with this host's node among them, and that Ray offers as
many GPUs on this node as the plan gives it (the PCI bus's count; 0 on a head that is not a
training node; SKIP on simulated hosts: no GPU there). A host the cluster plan leaves out
(``left_out_checks``) must run no member: SKIP naming why, FAIL when its unit is installed.
"""

from __future__ import annotations

from p40fleet.ray import UNIT_NAME, UNIT_PATH, RayProbe
from p40fleet.verification.check import FAIL, PASS, SIMULATED, SKIP, Check

__all__ = ["left_out_checks", "ray_checks"]

_DEPLOY = "run `pyinfra -y INVENTORY deploy/ray.py`"


def ray_checks(
    probe: RayProbe,
    *,
    address: str,
    nodes: int,
    pci_gpus: int,
    ray_gpus: int | None = None,
    simulated: bool = False,
) -> list[Check]:
    """The Ray checks of one host; one SKIP when deploy/ray.py never ran here. ``ray_gpus``:
    the GPUs Ray should offer here (default: ``pci_gpus``). ``simulated``: the inventory marks
    the host a simulated lab's; only then does the lab's marker SKIP the GPU check."""
    if not probe.unit:
        return [Check("ray", SKIP, f"not a Ray cluster member: no {UNIT_PATH} ({_DEPLOY})")]
    expected = pci_gpus if ray_gpus is None else ray_gpus
    return [
        _service(probe),
        _cluster(probe, address, nodes),
        _gpus(probe, pci_gpus, expected, simulated),
    ]


def left_out_checks(probe: RayProbe, why: str) -> list[Check]:
    """A host the cluster plan leaves out (``why``): it trains alone and runs no member."""
    if not probe.unit:
        return [Check("ray", SKIP, f"not in the Ray cluster: {why} (it trains alone)")]
    return [
        Check(
            "ray",
            FAIL,
            f"left out of the Ray cluster ({why}) but {UNIT_PATH} is installed: its GPUs "
            "would join the cluster's run",
            f"{_DEPLOY} (it stops and removes the unit on hosts the plan leaves out)",
        )
    ]


def _service(probe: RayProbe) -> Check:
    state = f"is-active: {probe.active or '?'}, is-enabled: {probe.enabled or '?'}"
    if probe.active == "active" and probe.enabled == "enabled":
        return Check("ray service", PASS, f"{UNIT_NAME} {state}")
    return Check(
        "ray service",
        FAIL,
        f"{UNIT_NAME} {state}",
        f"see `systemctl status {UNIT_NAME}` on the host, then {_DEPLOY}",
    )


def _cluster(probe: RayProbe, address: str, nodes: int) -> Check:
    status = probe.status
    if status is None:
        tail = " | ".join(probe.status_tail) or "no output"
        return Check(
            "ray cluster",
            FAIL,
            f"`ray status --address {address}` failed (rc={probe.status_rc}): {tail}",
            f"start the head's {UNIT_NAME} (is {address} reachable from here?), then {_DEPLOY}",
        )
    active = len(status.active)
    member = bool(probe.node_id) and probe.node_id in status.active
    detail = f"{active}/{nodes} nodes active at {address}"
    if probe.membership == "ray status":
        detail += f" (as `ray status` lists them: the GCS node table was not read: " \
                  f"{' | '.join(probe.gcs_tail)})"  # fmt: skip
    elif probe.dead:
        detail += f" ({len(probe.dead)} dead node(s) `ray status` still lists not counted)"
    if active == nodes and member:
        return Check("ray cluster", PASS, f"{detail}, this node {probe.node_id[:12]} among them")
    why = [] if active == nodes else [f"expected {nodes} (stack.ray.nodes or the inventory)"]
    if not member:
        why.append(f"this node ({probe.node_id[:12] or 'no raylet id'}) is not active")
    return Check(
        "ray cluster",
        FAIL,
        f"{detail}: {'; '.join(why)}",
        f"check {UNIT_NAME} on the hosts missing from `ray status`, then {_DEPLOY}",
    )


def _gpus(probe: RayProbe, pci_gpus: int, expected: int, simulated: bool) -> Check:
    if probe.simulated and simulated:
        return Check("ray GPUs", SKIP, f"{SIMULATED}: no GPU for Ray to detect")
    status = probe.status
    if status is None or probe.node_id not in status.per_node:
        return Check("ray GPUs", SKIP, "not checked: this node is not in `ray status`")
    offered = int(status.per_node[probe.node_id].get("GPU", 0))
    plan = (
        f"{pci_gpus} on the PCI bus"
        if expected == pci_gpus
        else f"{expected} planned (a head that is not a training node; {pci_gpus} on the PCI bus)"
    )
    if offered == expected:
        return Check("ray GPUs", PASS, f"Ray offers {offered} GPUs here = {plan}")
    return Check(
        "ray GPUs",
        FAIL,
        f"Ray offers {offered} GPUs on this node, expected {plan}",
        f"make nvidia-smi answer on the host (deploy/system.py), then "
        f"`systemctl restart {UNIT_NAME}`",
    )
