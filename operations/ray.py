"""The Ray cluster member of a host: a systemd unit running ``ray start ... --block``.

The unit (``files/ray.service.j2``, rendered from :class:`p40fleet.ray.RayPlan`) carries the
head's address, so "a running member of the right cluster" is: the unit file is the one this
plan renders, and the unit is running and enabled. Then nothing is done. Otherwise pyinfra's
own operations do the work: ``files.template`` writes the unit, ``systemd.service`` reloads,
(re)starts and enables it. systemd restarts the member when it dies (``Restart=always``) and
starts it at boot (``WantedBy=multi-user.target``).

Token authentication (review S2): the cluster's token (``p40fleet.ray.cluster_token``, made
once on the controller and kept in its cache) lives on the member in ``TOKEN_FILE``,
root:root 0600 in root's ``/etc/p40fleet`` (never under the training user's home); the unit
sets ``RAY_AUTH_MODE=token`` and has systemd read that file. A new or changed token restarts
the member, as a new unit does. The token is never in an operation's name, a log or a command
line: it travels only as the upload's content.
"""

from __future__ import annotations

import hashlib

from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.facts.files import File, Sha1File
from pyinfra.operations import files, systemd

from p40fleet.facts.ray import HasSystemd
from p40fleet.facts.survey import ask
from p40fleet.operations.proxy import root_secret
from p40fleet.operations.refuse import refuse
from p40fleet.paths import FILES
from p40fleet.ray import (
    TOKEN_DIR,
    TOKEN_FILE,
    UNIT_NAME,
    UNIT_PATH,
    RayError,
    RayPlan,
    cluster_token,
    token_file_text,
)

__all__ = ["TEMPLATE", "ray_left_out", "ray_member"]

TEMPLATE = str(FILES / "ray.service.j2")
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
    ray = plan.cli or plan.argv[0]
    if not ask(host, File, path=ray):
        yield from refuse._inner(
            step=STEP,
            reason=f"the env's ray CLI {ray} is missing",
            remedy="run deploy/python.py first (it installs ray with verl's pinned requirements)",
        )
        return
    try:
        text = token_file_text(cluster_token(plan.cluster))
    except RayError as exc:
        yield from refuse._inner(step=STEP, reason=exc.cause, remedy=exc.fix)
        return
    yield from _token_file(text)
    # a member that runs with another token (or none) restarts: a mode fixed alone does not
    new_token = ask(host, Sha1File, path=TOKEN_FILE) != hashlib.sha1(text.encode()).hexdigest()
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
    # A new unit file: reload it, and restart a member that runs the old one (or the old token).
    yield from systemd.service._inner(
        service=UNIT_NAME,
        running=True,
        restarted=bool(unit) or new_token,
        enabled=True,
        daemon_reload=bool(unit),
    )


def _token_file(text: str):
    """Yield what makes ``TOKEN_FILE`` hold ``text``, root:root 0600 (nothing when it does)."""
    yield from root_secret(TOKEN_DIR, TOKEN_FILE, text)


@operation()
def ray_left_out(why: str):
    """
    Run no Ray member here: this host is not in the cluster's plan (it trains alone).

    + why: why the plan leaves it out (for the log)

    A unit of an earlier plan is stopped, disabled and removed (pyinfra's own operations), and
    the cluster's token with it; no unit and no token: nothing to do.
    """
    token = ask(host, File, path=TOKEN_FILE)  # no stale token stays on a host left out
    if not ask(host, File, path=UNIT_PATH):
        if token:
            yield from files.file._inner(path=TOKEN_FILE, present=False)
        else:
            host.noop(f"no Ray member here: left out of the cluster ({why})")
        return
    yield from systemd.service._inner(service=UNIT_NAME, running=False, enabled=False)
    yield from files.file._inner(path=UNIT_PATH, present=False)
    yield StringCommand("systemctl", "daemon-reload")
    if token:
        yield from files.file._inner(path=TOKEN_FILE, present=False)
