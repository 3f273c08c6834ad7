"""``python -m p40fleet.deploy INVENTORY DEPLOY... [pyinfra args]``: check, then run pyinfra.

    python -m p40fleet.deploy inventories/lab.py deploy/full.py -y --limit lab2

Before anything connects, refuses (exit 2) what plain pyinfra would run silently:

* an inventory file that does not exist (pyinfra treats the name as a host, or finds 0 hosts
  and exits 0 having done nothing);
* an inventory with 0 hosts;
* a host name listed twice in one group, or given host data in two places (pyinfra merges the
  second entry's data into the first without a word);
* two hosts at one address (``ssh_hostname``, else the name): one machine would be provisioned
  twice at once, and Ray would expect a node more than there is.

Then runs ``python -m pyinfra INVENTORY DEPLOY... ARGS`` from the checkout. A run that ends
with a verification (``deploy/full.py``, ``deploy/verify.py``) exits as ``python -m
p40fleet.verify`` does, from the report it writes (``$P40FLEET_REPORT``, a temporary file
unless set): 0 every host passed, 1 a host failed or could not be reached, 3 the others were
all refused (outside the stack, or refused by the preflight). Any other run exits with
pyinfra's status (0 all hosts done, 1 a host failed).
"""

from __future__ import annotations

import ipaddress
import os
import runpy
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from p40fleet import report
from p40fleet.paths import REPO

__all__ = ["InventoryError", "check_inventory", "main", "split_args"]

#: Deploys that end with a verification report: the run's exit status comes from it.
_VERIFYING = frozenset({"full.py", "verify.py"})

EXIT_USAGE = 2
USAGE = "usage: python -m p40fleet.deploy INVENTORY DEPLOY.py [DEPLOY.py ...] [pyinfra args]"


class InventoryError(Exception):
    """Exit 2 with this message."""


def split_args(argv: Sequence[str]) -> tuple[str, list[str], list[str]]:
    """``INVENTORY DEPLOY.py... REST`` → (inventory, deploys, pyinfra args)."""
    if not argv or argv[0].startswith("-"):
        raise InventoryError(USAGE)
    deploys = []
    rest = list(argv[1:])
    while rest and rest[0].endswith(".py") and not rest[0].startswith("-"):
        deploys.append(rest.pop(0))
    if not deploys:
        raise InventoryError(f"no deploy file given\n{USAGE}")
    return argv[0], deploys, rest


def _name(item: Any) -> str:
    return str(item[0] if isinstance(item, tuple) else item)


def _groups(path: Path) -> dict[str, list]:
    """The inventory file's groups as pyinfra reads them (module-level lists, or tuples of
    (hosts, data), of names or (name, data))."""
    sys.path[:0] = [str(REPO)] if str(REPO) not in sys.path else []
    try:
        attrs = runpy.run_path(str(path))
    except Exception as exc:  # noqa: BLE001 - any error of the user's file is reported, exit 2
        raise InventoryError(
            f"inventory {path} failed to load: {type(exc).__name__}: {exc}"
        ) from None
    groups = {}
    for key, value in attrs.items():
        if key.startswith("_") or not isinstance(value, (list, tuple)):
            continue
        hosts = value[0] if isinstance(value, tuple) and value else value
        if isinstance(hosts, list) and all(
            isinstance(i, str) or (isinstance(i, tuple) and i and isinstance(i[0], str))
            for i in hosts
        ):
            groups[key] = hosts
    return groups


def _repeated_names(groups: dict[str, list]) -> list[str]:
    problems = []
    with_data: dict[str, list[str]] = defaultdict(list)
    for group, hosts in groups.items():
        names = [_name(i) for i in hosts]
        for name in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"host {name} is listed {names.count(name)} times in group {group}")
        for item in hosts:
            if isinstance(item, tuple) and len(item) > 1 and item[1]:
                with_data[_name(item)].append(group)
    for name, where in sorted(with_data.items()):
        if len(where) > 1:
            problems.append(
                f"host {name} is given host data in {len(where)} places ({', '.join(where)}): "
                "pyinfra would merge the second into the first"
            )
    return problems


def normalised_address(address: str) -> str:
    """One spelling per machine: an IP in ``ipaddress``'s form (``2001:DB8:0:0::1`` ->
    ``2001:db8::1``), a name lowercased without its trailing dot (``Node.lab.`` -> ``node.lab``)."""
    text = address.strip().removeprefix("[").removesuffix("]")
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return text.lower().rstrip(".")


def _addresses(hosts: Iterable[Any]) -> list[str]:
    """Two hosts of the inventory at one (address, SSH port): one machine listed twice. Hosts
    behind one NAT or bastion address on different ``ssh_port``s are different machines."""
    at: dict[tuple[str, int], list[str]] = defaultdict(list)
    for host in hosts:
        address = normalised_address(str(host.data.get("ssh_hostname") or host.name))
        try:
            port = int(host.data.get("ssh_port") or 22)
        except (TypeError, ValueError):
            port = 22  # pyinfra refuses it itself, naming the host
        at[(address, port)].append(host.name)
    return [
        f"hosts {', '.join(names)} share the address {address} port {port}: one machine would "
        "be provisioned twice at once"
        for (address, port), names in sorted(at.items())
        if len(names) > 1
    ]


def check_inventory(inventory: str) -> int:
    """Refuse a missing, empty or ambiguous inventory file; return its number of hosts."""
    path = Path(inventory).expanduser()
    if not path.is_file():
        raise InventoryError(
            f"inventory file {inventory} does not exist (pyinfra would take it for a host name "
            "or run against 0 hosts); give the path of an inventory file"
        )
    problems = _repeated_names(_groups(path))
    # pyinfra's own reading (group_data included): the hosts and the data they will run with
    from p40fleet.runtime.inventory import load_inventory

    try:
        hosts = list(load_inventory(str(path.resolve()), REPO))
    except Exception as exc:  # noqa: BLE001 - reported, exit 2
        raise InventoryError(
            f"inventory {path} failed to load: {type(exc).__name__}: {exc}"
        ) from None
    if not hosts:
        raise InventoryError(f"inventory {inventory} has 0 hosts: nothing would be deployed")
    problems += _addresses(hosts)
    if problems:
        raise InventoryError(
            f"inventory {inventory}: "
            + "; ".join(problems)
            + " — fix: list each machine once, under one name"
        )
    return len(hosts)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    try:
        inventory, deploys, rest = split_args(args)
        missing = [d for d in deploys if not (REPO / d).is_file() and not Path(d).is_file()]
        if missing:
            raise InventoryError(f"deploy file(s) {', '.join(missing)} do not exist")
        count = check_inventory(inventory)
    except InventoryError as exc:
        print(f"p40fleet.deploy: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"p40fleet.deploy: inventory {inventory}: {count} host(s), each at its own address")
    command = [sys.executable, "-m", "pyinfra", str(Path(inventory).resolve()), *deploys, *rest]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        dict.fromkeys([str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    )
    verifies = any(Path(d).name in _VERIFYING for d in deploys) and "--dry" not in rest
    with tempfile.TemporaryDirectory(prefix="p40fleet-deploy-") as tmp:
        path = env.setdefault(report.REPORT_ENV, str(Path(tmp) / "report.json"))
        if os.path.exists(path) and verifies:
            os.unlink(path)  # an old report must not give this run's exit status
        try:
            rc = subprocess.call(command, cwd=REPO, env=env)
        except OSError as exc:
            print(f"p40fleet.deploy: cannot run pyinfra: {exc}", file=sys.stderr)
            return EXIT_USAGE
        if not verifies or rc not in (0, 1) or not os.path.exists(path):
            return rc
        try:
            fleet = report.load_report(path)
        except report.ReportError as exc:
            print(f"p40fleet.deploy: {exc}", file=sys.stderr)
            return rc or report.EXIT_FAIL
    code = report.exit_code(fleet)
    return report.EXIT_FAIL if code == report.EXIT_OK and rc != 0 else code
