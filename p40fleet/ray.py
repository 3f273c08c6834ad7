"""The Ray cluster of deploy/ray.py, as data: who is the head, what each host runs, what
``ray status`` says.

Pure functions, no pyinfra. :func:`plan_ray` turns the spec (``stack.ray``) and the inventory's
choice of head into a :class:`RayPlan`: the ``ray start ... --block`` command line that the
systemd unit ``p40fleet-ray.service`` (``files/ray.service.j2``) runs as the training user.
:func:`parse_probe` reads the answers of the ``facts.ray.RayStatus`` fact (the unit's state and
``ray status -v``, real Ray 2.48 output: ``tests/fixtures/ray/``).

Token authentication (Ray >= 2.52, review S2): every member runs with ``RAY_AUTH_MODE=token``
and the cluster's token (:func:`cluster_token`: made once on the controller, kept in its cache
at 0600) read by systemd from :data:`TOKEN_FILE` (root:root 0600, outside the training user's
home). A client without that token is refused by the GCS, the raylets and the Ray Client
server. The Ray Client server runs only with ``stack.ray.client_server``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from p40fleet.controller import cache_dir
from p40fleet.jsonable import ToJson
from p40fleet.spec import StackSpec

__all__ = [
    "HEAD_GROUP",
    "MEMBERS_FILE",
    "UNIT_NAME",
    "UNIT_PATH",
    "TOKEN_FILE",
    "ClusterStatus",
    "LearntMembers",
    "RayError",
    "RayPlan",
    "RayProbe",
    "choose_head",
    "cluster_token",
    "host_port",
    "token_file_text",
    "token_path",
    "load_members",
    "members_path",
    "parse_probe",
    "parse_status",
    "plan_ray",
    "ray_cli",
    "save_members",
    "systemd_quote",
]

UNIT_NAME = "p40fleet-ray.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
#: Inventory group whose one host is the head when ``stack.ray.head`` is not set.
HEAD_GROUP = "ray_head"
#: The cluster's token on a member: root:root 0600, ``RAY_AUTH_TOKEN=<hex>``; systemd reads it
#: for the unit (``EnvironmentFile=``), root for verify's ``ray status`` (facts.ray.RayStatus).
TOKEN_DIR = "/etc/p40fleet"
TOKEN_FILE = f"{TOKEN_DIR}/ray-auth.env"
#: Ray's own token format (``ray get-auth-token --generate``: ``secrets.token_hex(32)``).
_TOKEN = re.compile(r"[0-9a-f]{64}")
#: ``ray start`` for a head without the Ray Client server: Ray 2.52's ``ray start`` binds it
#: (port 10001, the head's address and loopback) whenever grpcio imports, and has no switch to
#: leave it out; told that the client's dependency is missing, it starts none (and refuses
#: ``--ray-client-server-port``). Run with the env's python as the ``ray`` console script.
RAY_START_NO_CLIENT = (
    "import sys; import ray.scripts.scripts as s; "
    "s.get_ray_client_dependency_error = lambda: ImportError("
    "'the Ray Client server is off (stack.ray.client_server)'); "
    "sys.argv[0] = 'ray'; sys.exit(s.main())"
)


class RayError(ValueError):
    """This host cannot be planned into the cluster; ``fix`` says what to change."""

    def __init__(self, cause: str, fix: str):
        super().__init__(cause)
        self.cause = cause
        self.fix = fix


def host_port(address: str, port: int) -> str:
    """``address:port`` as Ray's ``--address`` reads it: an IPv6 address in brackets
    (``[2001:db8::1]:6379``; ``2001:db8::1:6379`` is ambiguous)."""
    address = address.strip()
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def ray_cli(spec: StackSpec) -> str:
    """The env's ``ray`` command (ray is one of verl's pinned dependencies)."""
    return f"{spec.env.conda_prefix.rstrip('/')}/envs/{spec.env.name}/bin/ray"


def choose_head(spec: StackSpec, group: Sequence[str], inventory: Iterable[str]) -> str:
    """The head's inventory name: ``stack.ray.head``, else the one host of group ray_head."""
    names = set(inventory)
    if spec.ray.head is not None:
        if spec.ray.head not in names:
            raise RayError(
                f"stack.ray.head = {spec.ray.head!r} is not a host of this inventory",
                "set stack.ray.head to an inventory host name",
            )
        return spec.ray.head
    if len(group) != 1:
        found = f"has {len(group)} hosts ({', '.join(group)})" if group else "is missing"
        raise RayError(
            f"no head chosen: inventory group {HEAD_GROUP} {found}",
            f"put exactly one host in the inventory group {HEAD_GROUP}, or set stack.ray.head",
        )
    return group[0]


@dataclass(frozen=True)
class RayPlan:
    """What one host runs: head or worker, and the exact ``ray start`` arguments."""

    host: str
    head: str
    role: str  # "head" | "worker"
    address: str  # head_address:port, the GCS every member talks to
    user: str
    home: str
    argv: tuple[str, ...]
    env_bin: str
    cli: str = ""  # the env's ray CLI (argv[0] unless the head runs it through python -c)

    @property
    def cluster(self) -> str:
        """``head@address``: the cluster's name in the controller's records."""
        return f"{self.head}@{self.address}"

    def exec_start(self) -> str:
        """``argv`` as a systemd ``ExecStart=`` value."""
        return " ".join(systemd_quote(arg) for arg in self.argv)

    def template_vars(self) -> dict[str, str]:
        return {
            "role": self.role,
            "head": self.head,
            "address": self.address,
            "service_user": self.user,
            # Quoted for systemd: a path is one word with its specifiers (%) escaped.
            "work_dir": systemd_path(self.home),
            "env_home": systemd_quote(f"HOME={self.home}"),
            "env_path": systemd_quote(
                f"PATH={self.env_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
            ),
            "exec_start": self.exec_start(),
            "auth_mode": systemd_quote("RAY_AUTH_MODE=token"),
            "token_file": systemd_path(TOKEN_FILE),
        }


def plan_ray(
    spec: StackSpec,
    host_name: str,
    head: str,
    head_address: str,
    node_ip: str | None = None,
    num_gpus: int | None = None,
    resources: Mapping[str, int] | None = None,
) -> RayPlan:
    """The plan for ``host_name`` in the cluster headed by ``head`` (reached at head_address).

    ``node_ip``: this host's address on the cluster network when ``stack.ray.node_ip`` is not
    set (the inventory's ``ssh_hostname`` when that is an IP address): Ray then uses that
    network, not whichever address it would pick itself.
    ``num_gpus``: ``--num-gpus`` (0 on a head that is not a training node: Ray then places
    no training worker on its GPUs, which its own launch script uses alone).
    ``resources``: Ray's custom resources (``--resources``, compact JSON): a simulated training
    node offers ``{"cpu": <its GPUs>}`` with as many fake GPUs, what verl 0.5.0's CPU step
    asks a node for (``operations.run.ray_cluster.plan_for_host``).
    """
    ray = spec.ray
    address = host_port(head_address, ray.port)
    cli = ray_cli(spec)
    argv = [cli, "start"]
    if host_name == head and not ray.client_server:
        argv = [f"{cli.rsplit('/', 1)[0]}/python", "-c", RAY_START_NO_CLIENT, "start"]
    if host_name == head:
        argv += ["--head", f"--port={ray.port}"]
    else:
        argv.append(f"--address={address}")
    node_ip = ray.node_ip or node_ip
    if node_ip:
        argv.append(f"--node-ip-address={node_ip}")
    if num_gpus is not None:
        argv.append(f"--num-gpus={num_gpus}")
    if resources:
        offered = json.dumps(dict(sorted(resources.items())), separators=(",", ":"))
        argv.append(f"--resources={offered}")
    if host_name == head:
        argv.append(f"--include-dashboard={'true' if ray.dashboard else 'false'}")
        if ray.dashboard:
            # Loopback unless the spec names another address (its API runs jobs).
            argv += [f"--dashboard-host={ray.dashboard_host}",
                     f"--dashboard-port={ray.dashboard_port}"]  # fmt: skip
        if ray.client_server:
            argv.append(f"--ray-client-server-port={ray.client_server_port}")
        argv.append(f"--temp-dir={ray.temp_dir}")  # workers take the head's (Ray's rule)
    argv += ["--disable-usage-stats", "--block"]
    return RayPlan(
        host=host_name,
        head=head,
        role="head" if host_name == head else "worker",
        address=address,
        user=spec.user.name,
        home=spec.user.home,
        argv=tuple(argv),
        env_bin=cli.rsplit("/", 1)[0],
        cli=cli,
    )


# ------------------------------------------------------------------------------------------
# The cluster's token (kept on the controller)
# ------------------------------------------------------------------------------------------


def token_path(cluster: str) -> Path:
    """``<controller cache>/ray-auth/<cluster>.token`` (``cluster``: ``head@address``)."""
    name = re.sub(r"[^A-Za-z0-9_.@-]", "_", cluster)
    return cache_dir() / "ray-auth" / f"{name}.token"


def cluster_token(cluster: str, path: Path | None = None) -> str:
    """The token of ``cluster``: read from the controller's cache, else made there once
    (``secrets.token_hex(32)``, as ``ray get-auth-token --generate`` makes one) in a 0600 file
    of a 0700 directory, never replacing one that another run wrote first."""
    path = token_path(cluster) if path is None else path
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    if not path.exists():
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # 0600
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(32) + "\n")
            try:
                os.link(tmp, path)  # fails when another run made it first: that one is kept
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)
    token = path.read_text().strip()
    if not _TOKEN.fullmatch(token):
        raise RayError(
            f"the cluster's Ray token {path} is not 64 hex digits",
            f"remove {path} (a new token is made; the next deploy/ray.py run gives it to every "
            "member and restarts them)",
        )
    return token


def token_file_text(token: str) -> str:
    """:data:`TOKEN_FILE`'s content: systemd's ``EnvironmentFile=`` syntax."""
    if not _TOKEN.fullmatch(token):
        raise ValueError("a Ray token is 64 hex digits")
    return f"RAY_AUTH_TOKEN={token}\n"


# ------------------------------------------------------------------------------------------
# What the last full run learnt about the members (kept on the controller)
# ------------------------------------------------------------------------------------------

#: ``<controller cache>/ray-members.json`` (``$P40FLEET_CACHE``, else ``~/.cache/p40fleet``).
MEMBERS_FILE = "ray-members.json"


def members_path() -> Path:
    return cache_dir() / MEMBERS_FILE


@dataclass(frozen=True)
class LearntMembers:
    """Every inventory host of one cluster as the last full run saw it: its PCI GPU device
    ids, or why it was refused; ``learnt``: when that record was written (UTC)."""

    gpus: dict[str, tuple[int, ...]]
    refused: dict[str, str]
    learnt: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "learnt": self.learnt,
            "nodes": {
                **{n: {"gpus": list(g)} for n, g in self.gpus.items()},
                **{n: {"refused": why} for n, why in self.refused.items()},
            },
        }


def load_members(cluster: str, path: Path | None = None) -> LearntMembers | None:
    """The record of ``cluster`` (``head@address``); None when none, or unreadable (then the
    run plans without it and says so: it is never guessed)."""
    path = members_path() if path is None else path
    try:
        entry = json.loads(path.read_text())["clusters"][cluster]
        gpus = {n: tuple(int(d) for d in v["gpus"])
                for n, v in entry["nodes"].items() if "gpus" in v}  # fmt: skip
        refused = {n: str(v["refused"]) for n, v in entry["nodes"].items() if "refused" in v}
        return LearntMembers(gpus, refused, str(entry.get("learnt", "")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def save_members(
    cluster: str,
    gpus: Mapping[str, Sequence[int]],
    refused: Mapping[str, str],
    path: Path | None = None,
) -> bool:
    """Record what a full run learnt about ``cluster``'s hosts; False when the file already
    says so (it is then not touched). Written whole to a temporary file, then renamed."""
    path = members_path() if path is None else path
    new = LearntMembers({n: tuple(g) for n, g in gpus.items()}, dict(refused))
    old = load_members(cluster, path)
    if old is not None and (old.gpus, old.refused) == (new.gpus, new.refused):
        return False
    try:
        data = json.loads(path.read_text())
        clusters = data["clusters"] if isinstance(data.get("clusters"), dict) else {}
    except (OSError, ValueError, AttributeError, KeyError):
        clusters = {}
    learnt = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    clusters[cluster] = LearntMembers(new.gpus, new.refused, learnt).to_json()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        json.dump({"version": 1, "clusters": clusters}, handle, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return True


_PLAIN = re.compile(r"[A-Za-z0-9_./:=,@+-]+")


def systemd_path(path: str) -> str:
    """A path for a systemd setting that takes one unquoted path (``WorkingDirectory=``)."""
    if not re.fullmatch(r"/[A-Za-z0-9_./+-]*", path):
        raise ValueError(f"cannot put {path!r} in a systemd path setting ([A-Za-z0-9._/+-] only)")
    return path


def systemd_quote(arg: str) -> str:
    """One ExecStart word: plain, or double-quoted with systemd's escapes (``%`` and ``$`` too)."""
    if "\n" in arg or "\x00" in arg:
        raise ValueError(f"cannot put {arg!r} in a systemd command line")
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if _PLAIN.fullmatch(escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


# ------------------------------------------------------------------------------------------
# ray status -v (Ray 2.48's autoscaler v2 format; tests/fixtures/ray/)
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterStatus(ToJson):
    """What ``ray status -v`` reports: the active node ids, totals, resources per node.

    ``active`` is narrowed to the GCS node table's alive nodes where the probe read it
    (``parse_probe``): Ray 2.52's ``ray status`` lists dead nodes as active (ray#63566).
    """

    active: tuple[str, ...] = ()
    pending: int = 0
    totals: dict[str, float] = field(default_factory=dict)
    per_node: dict[str, dict[str, float]] = field(default_factory=dict)


_USAGE = re.compile(r"^\s*[\d.]+[A-Za-z]*/(?P<total>[\d.]+)(?P<unit>[A-Za-z]*)\s+(?P<name>\S+)\s*$")
_ACTIVE = re.compile(r"^\s*\d+\s+node_(?P<id>[0-9a-f]+)\s*$")
_NODE = re.compile(r"^Node:\s+(?P<id>[0-9a-f]+)\b")


def parse_status(lines: Iterable[str]) -> ClusterStatus | None:
    """Parse ``ray status [-v]`` output; None when it is not a status report (an error)."""
    active: list[str] = []
    pending = 0
    totals: dict[str, float] = {}
    per_node: dict[str, dict[str, float]] = {}
    section = ""
    node: str | None = None
    seen = False
    for raw in lines:
        line = raw.rstrip()
        if line.startswith("======== Autoscaler status"):
            seen = True
            continue
        if line.strip() in ("Active:", "Pending:", "Recent failures:", "Total Usage:", "Usage:"):
            section = line.strip()
            continue
        if m := _NODE.match(line):
            node, section = m["id"], ""
            per_node[node] = {}
            continue
        if section == "Active:" and (m := _ACTIVE.match(line)):
            active.append(m["id"])
        elif section == "Pending:" and line.strip() and not line.strip().startswith("("):
            pending += 1
        elif section in ("Total Usage:", "Usage:") and (m := _USAGE.match(line)):
            target = per_node[node] if section == "Usage:" and node else totals
            target[m["name"]] = float(m["total"])
        elif not line.strip() or line.startswith("-"):
            continue
        elif not line.startswith(" "):
            section = ""
    if not seen:
        return None
    return ClusterStatus(tuple(active), pending, totals, per_node)


@dataclass(frozen=True)
class RayProbe(ToJson):
    """The answers of ``facts.ray.RayStatus`` on one host."""

    unit: bool = False  # the unit file of deploy/ray.py exists
    active: str = ""  # systemctl is-active
    enabled: str = ""  # systemctl is-enabled
    simulated: bool = False
    node_id: str = ""  # this host's raylet node id ("" when none ran)
    status: ClusterStatus | None = None
    status_rc: int | None = None
    status_tail: tuple[str, ...] = ()  # last lines of ray status when it failed
    #: "gcs": ``active`` is the GCS node table's alive nodes; "ray status": that table was
    #: not readable (``gcs_tail`` says why) and ``active`` is what ``ray status`` listed
    membership: str = ""
    dead: tuple[str, ...] = ()  # nodes ray status listed as active that the GCS has as dead
    gcs_tail: tuple[str, ...] = ()


#: Prints the GCS node table (``@@gcs-node ID alive|dead IP``) through the client ``ray status``
#: itself uses; ``ray status`` alone lists dead nodes as active on Ray 2.52 (ray#63566).
GCS_NODES_PY = (
    "import sys\n"
    "from ray._raylet import GcsClient\n"
    "for n, i in GcsClient(address=sys.argv[1]).get_all_node_info(timeout=10).items():\n"
    "    s = 'alive' if i.state == type(i).ALIVE else 'dead'\n"
    "    print('@@gcs-node', n.hex(), s, i.node_manager_address)\n"
)
_GCS_NODE = re.compile(r"^@@gcs-node (?P<id>[0-9a-f]+) (?P<state>alive|dead) \S*$")


def _rc(text: str) -> int:
    return int(text) if re.fullmatch(r"-?\d+", text.strip()) else -1


def _with_gcs(
    status: ClusterStatus | None, gcs: list[str], rc: int | None
) -> tuple[ClusterStatus | None, str, tuple[str, ...], tuple[str, ...]]:
    """(status, membership, dead, tail): ``status.active`` narrowed to the GCS's alive nodes."""
    nodes = [m for line in gcs if (m := _GCS_NODE.match(line.strip()))]
    if status is None:
        return status, "", (), ()
    if rc != 0 or not nodes:
        tail = tuple(x for x in gcs if x.strip())[-2:] or (f"rc={rc}",)
        return status, "ray status", (), tail
    alive = {m["id"] for m in nodes if m["state"] == "alive"}
    dead = tuple(i for i in status.active if i not in alive)
    active = tuple(i for i in status.active if i in alive)
    active += tuple(sorted(alive - set(active)))
    return replace(status, active=active), "gcs", dead, ()


def parse_probe(lines: Iterable[str]) -> RayProbe:
    """Read the fact's output: ``key=value`` lines, then ``@@ray-status`` ... ``@@rc=N``, then
    ``@@gcs-nodes`` ... ``@@gcs-rc=N`` (the GCS node table)."""
    values: dict[str, str] = {}
    status_lines: list[str] | None = None
    gcs_lines: list[str] | None = None
    rc: int | None = None
    gcs_rc: int | None = None
    user = False  # after @@ray-user: the training user's output (it may print anything)
    for line in lines:
        if gcs_lines is not None:
            if line.startswith("@@gcs-rc="):
                gcs_rc = _rc(line[9:])
                break
            gcs_lines.append(line)
        elif rc is not None:
            if line.strip() == "@@gcs-nodes":
                gcs_lines = []
        elif status_lines is not None:
            if line.startswith("@@rc="):
                rc = _rc(line[5:])
                continue
            status_lines.append(line)
        elif line.strip() == "@@ray-status":
            status_lines = []
        elif line.strip() == "@@ray-user":
            user = True
        elif "=" in line:
            key, value = line.split("=", 1)
            if not user or key.strip() == "node_id" and "node_id" not in values:
                values[key.strip()] = value.strip()
    status = parse_status(status_lines or [])
    tail = tuple(x for x in (status_lines or []) if x.strip())[-3:] if status is None else ()
    status, membership, dead, gcs_tail = _with_gcs(status, gcs_lines or [], gcs_rc)
    return RayProbe(
        unit=values.get("unit") == "yes",
        active=values.get("active", ""),
        enabled=values.get("enabled", ""),
        simulated=values.get("sim") == "yes",
        node_id=values.get("node_id", ""),
        status=status,
        status_rc=rc,
        status_tail=tail,
        membership=membership,
        dead=dead,
        gcs_tail=gcs_tail,
    )
