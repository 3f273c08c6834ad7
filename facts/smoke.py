"""The smoke step of ``verify --smoke``: one PPO step through ~/launch-ppo.sh, as a fact.

The script is ``files/verify-smoke.sh.j2`` rendered with the host's paths; all of it runs as the
training user (``p40fleet.privdrop``), root only tests whether the host is simulated. It
changes nothing the user owns (its scratch directory in /tmp is made and removed by the user)
and always exits 0: what happened is in the answer, which ``p40fleet.verification.smoke`` turns
into the ``smoke step`` check. Asked only by ``deploy/verify.py`` with ``verify_smoke`` set.
:class:`ClusterSmokeStep`: the Ray head's one step over the cluster's plan (the same template,
root's cluster token on the user's stdin as the collective check hands it; never `ray stop`).
"""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase
from typing_extensions import override

from p40fleet.facts.survey import one_write
from p40fleet.facts.verify import SIMULATED_HOST_TEST
from p40fleet.privdrop import AS_USER_FN
from p40fleet.ray import TOKEN_FILE
from p40fleet.verification import smoke
from p40fleet.verification.smoke_script import (
    RAY_PORT,
    SMOKE_TEMPLATE,
    ClusterSmokeTargets,
    SmokeTargets,
    render_cluster_job,
    render_job,
)

__all__ = [
    "RAY_PORT",
    "SMOKE_TEMPLATE",
    "ClusterSmokeStep",
    "ClusterSmokeTargets",
    "SmokeStep",
    "SmokeTargets",
    "render_cluster_smoke",
    "render_job",
    "render_smoke",
]


#: Seconds the job may take besides the training step's own limit (a CPU Ray's start and stop,
#: the env's imports): past that root ends it (``p40fleet_ask``, as every user-run fact).
SETUP_S = 600


def _as_user(targets: SmokeTargets | ClusterSmokeTargets, job: str, stdin: str, pre: str) -> str:
    """Both steps' command: root tests whether the host is simulated (only on a host the
    inventory marks so: elsewhere the lab's marker is ignored) and runs ``pre``, the training
    user runs ``job`` with ``stdin``; a missing user reads as an absent launch script."""
    u = shlex.quote(targets.user)
    sim = (
        f"if {SIMULATED_HOST_TEST}; then p40fleet_sim=yes; else p40fleet_sim=no; fi"
        if targets.simulated
        else "p40fleet_sim=no"
    )
    return (
        f"{AS_USER_FN}\n"
        f"{sim}\n"
        f"{pre}"
        f"if id -u {u} >/dev/null 2>&1; then "
        f"p40fleet_ask {int(targets.timeout_s) + SETUP_S} {u} "
        f'sh -c {shlex.quote(job)} sh "$p40fleet_sim" <{stdin}; '
        f"else echo '@@p40fleet-smoke 1'; echo 'launch=absent'; echo '@@end'; fi; true"
    )


def render_smoke(targets: SmokeTargets) -> str:
    """The whole command: the training user runs the job (never root: the launch script, the
    env and the checkout are the user's) with nothing on its stdin."""
    if not targets.user:
        raise ValueError("no training user given: the smoke step never runs as root")
    return _as_user(targets, render_job(targets), "/dev/null", "")


def render_cluster_smoke(targets: ClusterSmokeTargets) -> str:
    """The Ray head's command: root opens its cluster token file for the user's stdin
    (root:root 0600, never a link); the training user runs the job."""
    if not targets.user:
        raise ValueError("no training user given: the cluster smoke step never runs as root")
    token = shlex.quote(TOKEN_FILE)
    pre = (
        f"if [ -f {token} ] && [ ! -L {token} ]; then p40fleet_tk={token}; "
        "else p40fleet_tk=/dev/null; fi\n"
    )
    return _as_user(targets, render_cluster_job(targets), '"$p40fleet_tk"', pre)


class _SmokeFact(FactBase[smoke.SmokeRun]):
    """What both steps share: the answer is ``SmokeRun``, read by one parser."""

    abstract = True  # pyinfra's mark for a base that is never asked itself

    @staticmethod
    @override
    def default() -> smoke.SmokeRun:
        return smoke.SmokeRun()

    @override
    def process(self, output: list[str]) -> smoke.SmokeRun:
        return smoke.parse_smoke(output)


class SmokeStep(_SmokeFact):
    """
    Returns what one PPO smoke step through the host's ~/launch-ppo.sh said (``SmokeRun``).
    Runs minutes; never fails the host.
    """

    @override
    def command(self, targets: SmokeTargets) -> str:
        return one_write(render_smoke(SmokeTargets(*targets))).get_raw_value()


class ClusterSmokeStep(_SmokeFact):
    """
    Returns what one PPO step over the Ray cluster's plan, run on the head, said
    (``SmokeRun``). Runs minutes; never fails the host.
    """

    @override
    def command(self, targets: ClusterSmokeTargets) -> str:
        t = ClusterSmokeTargets(*targets)
        t = t._replace(members=tuple(tuple(m) for m in t.members))
        return one_write(render_cluster_smoke(t)).get_raw_value()
