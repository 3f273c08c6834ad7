"""The collective check of ``verify --collective``, as a fact asked on the Ray head only.

The script is ``files/verify-collective.sh.j2`` rendered for the cluster; all of it runs as the
training user (``p40fleet.privdrop``), root only tests whether the host is simulated. It changes
nothing the user owns (its scratch dir in /tmp is made and removed by the user) and always exits
0: what happened is in the answer, which ``p40fleet.verification.collective`` turns into checks.
"""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase
from typing_extensions import override

from p40fleet.facts.survey import one_write
from p40fleet.facts.verify import SIMULATED_HOST_TEST
from p40fleet.privdrop import AS_USER_FN
from p40fleet.ray import TOKEN_FILE
from p40fleet.verification import collective
from p40fleet.verification.collective_script import CollectiveTargets, render_job

__all__ = ["CollectiveRunFact", "CollectiveTargets", "render_collective"]


def render_collective(targets: CollectiveTargets) -> str:
    """The whole command: root tests whether the host is simulated, the training user runs the
    job (never root: the env, Ray's session and the scratch dir are the user's)."""
    if not targets.user:
        raise ValueError("no training user given: the collective check never runs as root")
    u, token = shlex.quote(targets.user), shlex.quote(TOKEN_FILE)
    bound = int(targets.timeout_s) + 60  # the job's own bound, then its clean-up
    return (
        f"{AS_USER_FN}\n"
        f"if {SIMULATED_HOST_TEST}; then p40fleet_sim=yes; else p40fleet_sim=no; fi\n"
        # root's token file (root:root 0600) on the user's stdin: the driver joins the cluster
        f"if [ -f {token} ] && [ ! -L {token} ]; then p40fleet_tk={token}; "
        "else p40fleet_tk=/dev/null; fi\n"
        f"if id -u {u} >/dev/null 2>&1; then "
        f"p40fleet_ask {bound} {u} sh -c {shlex.quote(render_job(targets))} "
        'sh "$p40fleet_sim" <"$p40fleet_tk"; '
        f"else echo '@@p40fleet-collective 1'; "
        f"echo {shlex.quote(f'@@error the training user {targets.user} is missing')}; "
        f"echo '@@end'; fi; true"
    )


class CollectiveRunFact(FactBase[collective.CollectiveRun]):
    """
    Returns what one all-reduce over the cluster's training nodes said (``CollectiveRun``).
    Runs up to its bound; never fails the host.
    """

    @staticmethod
    @override
    def default() -> collective.CollectiveRun:
        return collective.CollectiveRun()

    @override
    def command(self, targets: CollectiveTargets) -> str:
        t = CollectiveTargets(*targets)
        t = t._replace(members=tuple(tuple(m) for m in t.members))
        return one_write(render_collective(t)).get_raw_value()

    @override
    def process(self, output: list[str]) -> collective.CollectiveRun:
        return collective.parse_collective(output)
