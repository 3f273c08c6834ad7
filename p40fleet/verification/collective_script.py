"""The collective check's script: ``files/verify-collective.sh.j2`` rendered (no pyinfra).

``facts.collective.CollectiveRunFact`` runs it on the Ray head as the training user; the GPU proof
runs the same text by hand (``sh JOB no`` with address ``local``: a private Ray on that machine),
so the device run and verify share one code path.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NamedTuple

from p40fleet.shell_template import shell_template
from p40fleet.verification import collective
from p40fleet.verl_patches import APPLIER_PATH

__all__ = ["COLLECTIVE_TEMPLATE", "LOCAL", "CollectiveTargets", "render_job"]

COLLECTIVE_TEMPLATE = APPLIER_PATH.parent / "verify-collective.sh.j2"
#: The address that makes the driver start a private Ray on its own machine (the GPU proof).
LOCAL = "local"
#: Lines of the driver's log the script sends back.
SCRIPT_LOG_LINES = 30


class CollectiveTargets(NamedTuple):
    """What one collective run needs: the training user, the env's python, the Ray head's GCS
    address (or :data:`LOCAL`), the rendezvous host and port (the head's address, a pin), the
    members as ``(name, address)`` in rank order, and the bound in seconds. Hashable."""

    user: str
    python: str
    address: str
    store_host: str
    port: int
    members: tuple[tuple[str, str], ...]
    timeout_s: int


def config(targets: CollectiveTargets) -> dict:
    """The driver's config (``config.json`` in its scratch dir)."""
    members: Sequence[tuple[str, str]] = targets.members
    for name, address in members:
        if not name or not address or any(c.isspace() for c in name + address):
            raise ValueError(f"member {name!r} at {address!r}: expected a name and an address")
    return {
        "address": targets.address,
        "store_host": targets.store_host,
        "port": int(targets.port),
        "members": [list(m) for m in members],
        "sizes": list(collective.SIZES),
        "iterations": [list(i) for i in collective.ITERATIONS],
        "join_s": collective.join_timeout_s(targets.timeout_s),
        "limit_s": int(targets.timeout_s),
    }


def render_job(targets: CollectiveTargets) -> str:
    """The script the training user runs (``$1``: ``yes`` on a simulated host: gloo)."""
    return shell_template(COLLECTIVE_TEMPLATE).render(
        python=targets.python,
        address=targets.address,
        timeout_s=int(targets.timeout_s),
        log_lines=SCRIPT_LOG_LINES,
        config_json=json.dumps(config(targets), sort_keys=True),
    )
