"""Lab networking: bridge labbr0 (10.231.0.1/24), one netns + veth per host, a safety route.

Names are prefixed so they never collide with other labs on the box (e.g. the bash prototype's
``lab1`` netns / ``vlab1`` veths): host ``lab1`` lives in netns ``p40lab-lab1`` behind veth
``p4vlab1`` (host end on the bridge; ``eth0`` inside, no default route). The route
``unreachable 10.231.0.0/24 metric 4000`` keeps lab traffic on this machine even if the bridge
disappears. Another instance (``$P40LAB_INSTANCE``, see :mod:`p40lab.state`) has its own
bridge, subnet and prefixes; everything here matches names exactly (prefix + ``labN``), so one
instance never sees, or removes, another's namespaces or links.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

from p40lab.state import (
    BRIDGE,
    CONTROLLER_IP,
    HOST_PREFIX,
    NETNS_PREFIX,
    SUBNET,
    VETH_PREFIX,
    LabError,
    cli,
)
from p40lab.util import run

UNREACHABLE = ["unreachable", SUBNET, "metric", "4000"]
_OUR_NETNS = re.compile(re.escape(NETNS_PREFIX + HOST_PREFIX) + r"\d+")
_OUR_VETH = re.compile(re.escape(VETH_PREFIX + HOST_PREFIX) + r"\d+")


def netns_name(host: str) -> str:
    return f"{NETNS_PREFIX}{host}"


def veth_name(host: str) -> str:
    name = f"{VETH_PREFIX}{host}"
    if len(name) > 15:
        raise LabError(f"host name {host!r} too long for an interface name")
    return name


def our_veths() -> list[str]:
    """Host-side veths of this instance (by exact name pattern)."""
    return sorted(p.name for p in Path("/sys/class/net").iterdir() if _OUR_VETH.fullmatch(p.name))


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def our_netns() -> list[str]:
    """Network namespaces this lab created (by prefix)."""
    try:
        names = [p.name for p in Path("/run/netns").iterdir()]
    except FileNotFoundError:
        return []
    return sorted(n for n in names if _OUR_NETNS.fullmatch(n))


def route_present() -> bool:
    out = run(["ip", "route", "show", "table", "main", "exact", SUBNET], quiet=True)
    return any(
        line.split()[:2] == ["unreachable", SUBNET] and "4000" in line.split()
        for line in out.stdout.splitlines()
    )


def subnet_users() -> list[str]:
    """Devices other than our bridge that route this instance's subnet (another lab, a VPN)."""
    out = run(["ip", "-o", "route", "show", "table", "main", "exact", SUBNET], quiet=True)
    devs = [w[w.index("dev") + 1] for w in map(str.split, out.stdout.splitlines()) if "dev" in w]
    return [d for d in devs if d != BRIDGE]


def bridge_up() -> None:
    users = subnet_users()
    if users:
        raise LabError(
            f"subnet {SUBNET} is already routed through {', '.join(users)}: give this lab "
            "another one (P40LAB_NET=10.231.N, or another P40LAB_INSTANCE name)"
        )
    run(["ip", "route", "replace", *UNREACHABLE])
    if not link_exists(BRIDGE):
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        run(["ip", "addr", "add", f"{CONTROLLER_IP}/24", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])


def bridge_down() -> None:
    if link_exists(BRIDGE):
        run(["ip", "link", "del", BRIDGE])
    if route_present():
        run(["ip", "route", "del", *UNREACHABLE])


def host_up(host: str, ip: str) -> None:
    ns, veth = netns_name(host), veth_name(host)
    if ns in our_netns():
        raise LabError(f"netns {ns} already exists: run `{cli('down')}`")
    cmds = [
        ["netns", "add", ns],
        ["link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns],
        ["link", "set", veth, "master", BRIDGE, "up"],
        ["-n", ns, "link", "set", "lo", "up"],
        ["-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0"],
        ["-n", ns, "link", "set", "eth0", "up"],
    ]
    for args in cmds:
        run(["ip", *args])


def host_down(host: str) -> None:
    ns, veth = netns_name(host), veth_name(host)
    if ns in our_netns():
        run(["ip", "netns", "del", ns])
    if link_exists(veth):
        run(["ip", "link", "del", veth], check=False, quiet=True)


def netns_pids(ns: str) -> list[int]:
    if ns not in our_netns():
        return []
    out = run(["ip", "netns", "pids", ns], check=False, quiet=True)
    return [int(p) for p in out.stdout.split() if p.isdigit()]


def ssh_banner(ip: str, timeout: float = 0.5) -> bool:
    """True when sshd at ip:22 answers with its banner."""
    try:
        with socket.create_connection((ip, 22), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def wait_ssh(ips: list[str], timeout: float = 30.0) -> list[str]:
    """Wait until every ip answers; returns the ones that did not."""
    pending = list(ips)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        pending = [ip for ip in pending if not ssh_banner(ip)]
        if pending:
            time.sleep(0.05)
    return pending
