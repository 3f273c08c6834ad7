"""A lab fault: a firewall in front of a host (``python -m p40lab block HOST --tcp PORTS``).

The firewall is the world's, not the host's: it is applied from the controller (the lab's
network) with ``nft`` inside the host's network namespace, so the host image stays stock and
nothing on the host can see or lift it. One nftables table, ``inet p40lab``, is the lab's; its
``input`` chain drops TCP to the given ports (optionally only from one address), so a
connection times out as it does behind a real firewall that drops. ``unblock`` deletes the
table; ``down`` removes it with the namespace (and clears it first, see :func:`clear`).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence

from p40lab.net import netns_name, our_netns
from p40lab.state import LabError, cli
from p40lab.util import run

TABLE = "p40lab"
FAMILY = "inet"
CHAIN = "input"
NFT_MISSING = (
    "nft is not installed on the controller: `apt-get install nftables` "
    "(or `sudo make lab-setup`, which installs the lab's Debian packages)"
)


def parse_ports(text: str) -> list[int]:
    """``"29500,6379"`` -> ``[29500, 6379]``; a clear error for anything but TCP ports."""
    ports: list[int] = []
    for word in text.split(","):
        word = word.strip()
        if not word.isdigit() or not 1 <= int(word) <= 65535:
            raise LabError(f"--tcp {text!r}: {word!r} is not a TCP port (1-65535)")
        if int(word) not in ports:
            ports.append(int(word))
    if not ports:
        raise LabError("--tcp: give at least one port, e.g. --tcp 29500")
    return ports


def nft_argv(host: str) -> list[str]:
    """``ip netns exec NS nft -f -``: the script comes on stdin, applied as one transaction."""
    return ["ip", "netns", "exec", netns_name(host), "nft", "-f", "-"]


def block_script(ports: Sequence[int], source: str | None = None) -> str:
    """nft commands that add the lab's table and chain (``add`` is idempotent) and one rule
    dropping TCP to ``ports`` (from ``source`` only, when given)."""
    if not ports:
        raise LabError("no port to block")
    match = f"ip saddr {source} " if source else ""
    ports_set = ", ".join(str(p) for p in ports)
    return (
        f"add table {FAMILY} {TABLE}\n"
        f"add chain {FAMILY} {TABLE} {CHAIN} "
        "{ type filter hook input priority 0; policy accept; }\n"
        f"add rule {FAMILY} {TABLE} {CHAIN} {match}tcp dport {{ {ports_set} }} drop\n"
    )


def unblock_script() -> str:
    """Delete the lab's table; declaring it first makes this a no-op when there is none."""
    return f"add table {FAMILY} {TABLE}\ndelete table {FAMILY} {TABLE}\n"


def list_argv(host: str) -> list[str]:
    return ["ip", "netns", "exec", netns_name(host), "nft", "list", "table", FAMILY, TABLE]


def _require(host: str) -> None:
    if shutil.which("nft") is None:
        raise LabError(NFT_MISSING)
    if netns_name(host) not in our_netns():
        raise LabError(f"{host}: no netns {netns_name(host)} (is the lab up? `{cli('status')}`)")


def block(host: str, ports: Sequence[int], source: str | None = None) -> None:
    _require(host)
    run(nft_argv(host), input=block_script(ports, source))


def unblock(host: str) -> None:
    _require(host)
    run(nft_argv(host), input=unblock_script())


def rules(host: str) -> str:
    """The lab's table in ``host``'s netns as nft lists it ("" when there is none)."""
    _require(host)
    out = run(list_argv(host), check=False, quiet=True)
    return out.stdout if out.returncode == 0 else ""


def clear(host: str) -> None:
    """For ``down``: drop the lab's table when nft and the netns are there (no nft: no table
    can have been made), never failing the teardown."""
    if shutil.which("nft") is None or netns_name(host) not in our_netns():
        return
    run(nft_argv(host), input=unblock_script(), check=False, quiet=True)
