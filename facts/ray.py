"""Facts of the Ray cluster: is systemd the init system, and how this host's Ray member is.

Both commands exit 0 on any host (nothing installed, no systemd, head down): what is missing
is in the answer. ``RayStatus`` changes nothing on the host (``ray status`` only asks the GCS).
"""

from __future__ import annotations

import shlex
from pathlib import PurePosixPath

from pyinfra.api import FactBase
from typing_extensions import override

from p40fleet.facts.verify import SIMULATED_HOST_TEST
from p40fleet.privdrop import AS_USER_FN
from p40fleet.ray import GCS_NODES_PY, TOKEN_FILE, UNIT_NAME, UNIT_PATH, RayProbe, parse_probe

__all__ = ["HasSystemd", "RayStatus", "STATUS_TIMEOUT_S"]

#: ``ray status`` waits ~35 s for a GCS that does not answer; the probe waits less.
STATUS_TIMEOUT_S = 20
#: The GCS node table's read (``GCS_NODES_PY``): its client gives up after 10 s.
GCS_TIMEOUT_S = 15
#: Bytes at the start of the newest raylet log searched for this node's id (written at start).
LOG_LIMIT = 1024 * 1024


class HasSystemd(FactBase[bool]):
    """True when systemd runs the host: ``/run/systemd/system`` exists (sd_booted()'s test)."""

    default = bool

    @override
    def command(self) -> str:
        return "if [ -d /run/systemd/system ]; then echo yes; else echo no; fi"

    @override
    def process(self, output: list[str]) -> bool:
        return bool(output) and output[0].strip() == "yes"


class RayStatus(FactBase[RayProbe]):
    """The unit's state, this host's raylet node id, ``ray status -v`` against ``address`` and
    the GCS's node table (which nodes are alive: ``ray status`` alone also lists dead ones)
    (asked only where deploy/ray.py installed the unit: elsewhere there is no member to ask for).

    + ray: the env's ``ray`` CLI
    + address: the head's GCS, ``HOST:PORT``
    + temp_dir: Ray's temp dir (the newest ``session_latest/logs/raylet*.out`` names this node)
    + user: the training user, who runs ``ray status`` (the CLI is in its env: never root)

    The cluster's token (``TOKEN_FILE``, root's own, root:root 0600): root opens it and hands
    it to the user's ``ray status`` on stdin (never on a command line or as a path to the user).
    """

    default = RayProbe

    @override
    def command(self, ray: str, address: str, temp_dir: str, user: str) -> str:
        unit, path = shlex.quote(UNIT_NAME), shlex.quote(UNIT_PATH)
        u, cli, token = shlex.quote(user), shlex.quote(ray), shlex.quote(TOKEN_FILE)
        py = shlex.quote(str(PurePosixPath(ray).with_name("python")))  # the CLI's env
        logs = shlex.quote(f"{temp_dir.rstrip('/')}/session_latest/logs")
        # Ray's temp dir is the training user's (Ray makes /tmp/ray 0777): its logs are read
        # as that user, a regular file only, bounded (a FIFO there ends by the time bound).
        # A raylet restarted in the same session (a worker that rejoins its head) writes
        # raylet.1.out, raylet.2.out, ...: the newest log names this node
        node = (
            f"log=$(ls -t {logs}/raylet*.out 2>/dev/null | head -n 1); "
            'if [ -n "$log" ] && [ -f "$log" ] && [ ! -L "$log" ]; then '
            f'echo "node_id=$(head -c {LOG_LIMIT} "$log" | sed -n '
            "'s/.*Setting node ID node_id=\\([0-9a-f]*\\).*/\\1/p' | tail -n 1)\"; "
            "else echo node_id=; fi; echo @@ray-status; "
        )
        status = node + (
            "if [ \"$1\" != yes ]; then echo 'not a member: no unit'; echo '@@rc=0'; "
            f"elif [ -x {cli} ]; then "
            # the token (RAY_AUTH_TOKEN=<hex>, from root's file on stdin) for Ray's own loader
            "IFS= read -r t || :; RAY_AUTH_TOKEN=${t#RAY_AUTH_TOKEN=}; t=; "
            "RAY_AUTH_MODE=token; export RAY_AUTH_MODE RAY_AUTH_TOKEN; "
            f"timeout {STATUS_TIMEOUT_S} {cli} status "
            f'--address {shlex.quote(address)} -v 2>&1 </dev/null; echo "@@rc=$?"; '
            f"echo @@gcs-nodes; timeout {GCS_TIMEOUT_S} {py} -c {shlex.quote(GCS_NODES_PY)} "
            f'{shlex.quote(address)} 2>&1 </dev/null; echo "@@gcs-rc=$?"; '
            f"else echo {shlex.quote(f'ray CLI {ray} is missing')}; echo '@@rc=127'; fi"
        )
        bound = STATUS_TIMEOUT_S + GCS_TIMEOUT_S + 10
        return "\n".join(
            [
                f"if [ -f {path} ]; then p40fleet_unit=yes; else p40fleet_unit=no; fi",
                'echo "unit=$p40fleet_unit"',
                "if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then",
                f'  echo "active=$(systemctl is-active {unit} 2>/dev/null)"',
                f'  echo "enabled=$(systemctl is-enabled {unit} 2>/dev/null)"',
                "fi",
                f"if {SIMULATED_HOST_TEST}; then echo sim=yes; else echo sim=no; fi",
                # what follows is the user's: only node_id and the status are taken from it
                "echo @@ray-user",
                f"if ! id -u {u} >/dev/null 2>&1; then echo node_id=; echo @@ray-status",
                '  if [ "$p40fleet_unit" = yes ]; then '
                f"echo {shlex.quote(f'training user {user} is missing')}; echo '@@rc=127'",
                "  else echo 'not a member: no unit'; echo '@@rc=0'; fi",
                "else",
                AS_USER_FN,
                f"  if [ -f {token} ] && [ ! -L {token} ]; then p40fleet_tk={token}; "
                "else p40fleet_tk=/dev/null; fi",
                f"  p40fleet_ask {bound} {u} sh -c {shlex.quote(status)} "
                'sh "$p40fleet_unit" <"$p40fleet_tk" '
                "|| { echo @@ray-status; echo '@@rc=124'; }",
                "fi",
            ]
        )

    @override
    def process(self, output: list[str]) -> RayProbe:
        return parse_probe(output)
