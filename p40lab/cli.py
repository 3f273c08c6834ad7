"""``python -m p40lab`` — the simulated lab's command line.

base [--force]                      build/cache the bookworm base rootfs (mmdebstrap)
up [--hosts N] [--gpus 4xP40,8xP40,1xP100,2xH200] [--no-headers lab2,lab3]
   [--os debian12 | --os lab3=debian12 ...] [--keep-disks] [--no-mirror]
down [--wipe]                       stop everything (netns, mounts, routes, bridge, PIDs)
status                              table: host, ip, gpus, os, up/down, uptime
reboot HOST [--no-wait]             PID 1 ends, the supervisor boots the host again
reinstall HOST [--keep-host-key]    OS reinstall: drop everything but /home, new ssh host key
host-key-fingerprint HOST           the host's ssh host key fingerprints, read from its disk
ssh HOST [CMD...]                   ssh with the lab key and known_hosts (strict)
known-hosts                         print the lab's known_hosts path and content
mirror-hook                         (re)run p40lab.mirror.ensure_mirror + httpd.start_server
leftovers                           what of the lab is still on the controller
block HOST --tcp PORT[,PORT...] [--from HOST2]
                                    a firewall in front of HOST (nft in its netns, from the
                                    controller): TCP to PORTs (from HOST2 only) is dropped
unblock HOST                        lift it (``down`` removes it too)

$P40LAB_INSTANCE=NAME runs any of these against another lab instance (its own state dir, bridge,
subnet, netns and mirror; see p40lab/state.py); unset, the default lab.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from p40lab import state as st
from p40lab.state import LabError
from p40lab.util import require_root


def cmd_base(args) -> int:
    from p40lab import base

    require_root()
    t0 = time.monotonic()
    seconds = base.build(force=args.force)
    if seconds is None:
        info = base.build_info()
        print(f"base cached: {st.BASE_DIR} (check {time.monotonic() - t0:.2f} s; "
              f"original build {info.get('seconds', '?')} s)")  # fmt: skip
    else:
        print(f"base built: {st.BASE_DIR} in {seconds:.1f} s")
    return 0


def cmd_up(args) -> int:
    from p40lab import base, hosts, plan

    require_root()
    specs = plan.plan(args.hosts, args.gpus, args.no_headers, args.os)
    base.build()  # cached: a stamp check; first time (or outdated): mmdebstrap, ~30 s
    t0 = time.monotonic()
    hosts.up(specs, keep_disks=args.keep_disks, mirror=not args.no_mirror, timeout=args.timeout)
    print(f"lab up: {len(specs)} hosts in {time.monotonic() - t0:.2f} s")
    return cmd_status(args)


def cmd_down(args) -> int:
    from p40lab import hosts

    require_root()
    t0 = time.monotonic()
    left = {k: v for k, v in hosts.down(wipe=args.wipe).items() if v}
    if left:
        print(f"lab down with LEFTOVERS: {left}", file=sys.stderr)
        return 1
    print(f"lab down in {time.monotonic() - t0:.2f} s: nothing left")
    return 0


def _fmt_uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def cmd_status(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from p40lab import plan, procs

    data = st.load()
    console = Console(width=None if sys.stdout.isatty() else 140)
    if not data.get("hosts"):
        console.print(f"the simulated lab is not up (no state): run `{st.cli('up')}`")
        return 1
    lab_up = st.is_up(data)
    instance = f"instance {st.INSTANCE}, " if st.INSTANCE else ""
    table = Table(title=f"p40lab ({instance}{'up' if lab_up else 'down'}) — {st.state_path()}")
    for col in ("host", "ip", "gpus", "os", "headers", "state", "uptime", "boots"):
        table.add_column(col)
    for h in data["hosts"]:
        running = lab_up and procs.host_is_up(h)
        powered_off = (plan.host_dirs(h["name"])["run"] / "powered-off").exists()
        state = "up" if running else ("off" if powered_off and lab_up else "down")
        ids = sorted(set(h["gpus"]))
        color = "green" if running else "red"
        table.add_row(
            h["name"], h["ip"], f"{h['layout']} ({', '.join(ids) or 'none'})", h["os"],
            "yes" if h["headers"] else "no", f"[{color}]{state}[/]",
            _fmt_uptime(procs.uptime(h)) if running else "-",
            str(procs.boots(h)) if lab_up else "-",
        )  # fmt: skip
    console.print(table)
    console.print(f"mirror {data.get('mirror_url')}  key {data.get('ssh_key')}  "
                  f"known_hosts {data.get('known_hosts')}")  # fmt: skip
    return 0


def cmd_reboot(args) -> int:
    from p40lab import hosts

    require_root()
    took = hosts.reboot(args.host, wait=not args.no_wait)
    print(f"{args.host}: rebooted" + (f", sshd back after {took:.2f} s" if took else ""))
    return 0


def cmd_reinstall(args) -> int:
    from p40lab import hosts

    require_root()
    took = hosts.reinstall(args.host, keep_host_key=args.keep_host_key)
    if args.keep_host_key:
        print(f"{args.host}: reinstalled in {took:.2f} s (/home kept, ssh host key kept)")
        return 0
    fps = ", ".join(fp for _kind, fp in hosts.host_key_fingerprints(args.host))
    print(f"{args.host}: reinstalled in {took:.2f} s (/home kept, NEW ssh host key {fps}); "
          f"re-key it: python -m p40fleet.rekey inventories/sim.py {args.host} --expect "
          "SHA256:...")  # fmt: skip
    return 0


def cmd_host_key_fingerprint(args) -> int:
    from p40lab import hosts

    for kind, fp in hosts.host_key_fingerprints(args.host):
        print(f"{fp} {kind}")
    return 0


def cmd_ssh(args) -> int:
    from p40lab import hosts

    h = hosts.get_host(args.host)
    tty = not args.command and sys.stdin.isatty()
    argv = hosts.ssh_argv(h, " ".join(args.command) if args.command else None, tty=tty)
    os.execvp(argv[0], argv)
    return 127  # not reached


def cmd_known_hosts(args) -> int:
    print(f"# {st.KNOWN_HOSTS}")
    try:
        print(st.KNOWN_HOSTS.read_text(), end="")
    except FileNotFoundError as exc:
        raise LabError(f"no known_hosts yet: run `{st.cli('up')}`") from exc
    return 0


def cmd_mirror_hook(args) -> int:
    from p40lab import hosts

    require_root()
    data = st.load()
    if not st.is_up(data):
        raise LabError(f"the simulated lab is not up: run `{st.cli('up')}`")
    hosts.mirror_hook("start", data)
    return 0


def cmd_leftovers(args) -> int:
    from p40lab import hosts

    left = hosts.leftovers()
    print(json.dumps(left, indent=2))
    return 1 if any(left.values()) else 0


def cmd_block(args) -> int:
    from p40lab import firewall, hosts

    require_root()
    ports = firewall.parse_ports(args.tcp)
    source = hosts.get_host(args.source)["ip"] if args.source else None
    hosts.get_host(args.host)  # a clear error for a host the lab does not have
    firewall.block(args.host, ports, source)
    where = f" from {args.source} ({source})" if source else ""
    print(f"{args.host}: TCP to {', '.join(map(str, ports))}{where} dropped "
          f"(`{st.cli('unblock ' + args.host)}` lifts it)")  # fmt: skip
    return 0


def cmd_unblock(args) -> int:
    from p40lab import firewall, hosts

    require_root()
    hosts.get_host(args.host)
    firewall.unblock(args.host)
    print(f"{args.host}: unblocked")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m p40lab", description="the simulated P40 lab")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("base", help="build the cached bookworm base rootfs")
    s.add_argument("--force", action="store_true", help="rebuild even when up to date")
    s.set_defaults(fn=cmd_base)
    s = sub.add_parser("up", help="start the lab")
    s.add_argument("--hosts", type=int, default=None, help="host count (default: one per layout)")
    s.add_argument(
        "--gpus",
        default="4xP40,8xP40,1xP100,2xH200",
        help="comma-separated per-host GPU layouts, e.g. 4xP40,0,2x1b38",
    )
    s.add_argument(
        "--no-headers",
        default="",
        metavar="HOSTS",
        help="hosts without /lib/modules/$(uname -r)/build, e.g. lab2,lab3",
    )
    s.add_argument(
        "--os",
        action="append",
        default=[],
        metavar="[HOST=]OS",
        help="debian12 (keep Debian's os-release) or ubuntu20.04 (default)",
    )
    s.add_argument("--keep-disks", action="store_true", help="keep the hosts' upper layers")
    s.add_argument("--no-mirror", action="store_true", help="skip the p40lab.mirror hook")
    s.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for sshd")
    s.set_defaults(fn=cmd_up)
    s = sub.add_parser("down", help="stop the lab, leave nothing behind")
    s.add_argument("--wipe", action="store_true", help="also delete the hosts' disks")
    s.set_defaults(fn=cmd_down)
    sub.add_parser("status", help="host table").set_defaults(fn=cmd_status)
    s = sub.add_parser("reboot", help="reboot a host")
    s.add_argument("host")
    s.add_argument("--no-wait", action="store_true")
    s.set_defaults(fn=cmd_reboot)
    s = sub.add_parser("reinstall", help="reinstall a host's OS (keeps /home; new host key)")
    s.add_argument("host")
    s.add_argument(
        "--keep-host-key", action="store_true", help="restore the old ssh host key (from backup)"
    )
    s.set_defaults(fn=cmd_reinstall)
    s = sub.add_parser("host-key-fingerprint", help="the host's key fingerprints, from its disk")
    s.add_argument("host")
    s.set_defaults(fn=cmd_host_key_fingerprint)
    s = sub.add_parser("ssh", help="ssh into a host")
    s.add_argument("host")
    s.add_argument("command", nargs=argparse.REMAINDER)
    s.set_defaults(fn=cmd_ssh)
    sub.add_parser("known-hosts", help="print known_hosts").set_defaults(fn=cmd_known_hosts)
    s = sub.add_parser("mirror-hook", help="run p40lab.mirror's ensure_mirror + start_server")
    s.set_defaults(fn=cmd_mirror_hook)
    s = sub.add_parser("leftovers", help="list lab remains on the controller")
    s.set_defaults(fn=cmd_leftovers)
    s = sub.add_parser("block", help="drop TCP to a host's ports (a firewall, from outside)")
    s.add_argument("host")
    s.add_argument("--tcp", required=True, metavar="PORT[,PORT...]", help="e.g. 29500,6379")
    s.add_argument(
        "--from", dest="source", metavar="HOST", help="only from this lab host (default: all)"
    )
    s.set_defaults(fn=cmd_block)
    s = sub.add_parser("unblock", help="lift a host's block")
    s.add_argument("host")
    s.set_defaults(fn=cmd_unblock)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except LabError as exc:
        print(f"p40lab: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("p40lab: interrupted", file=sys.stderr)
        return 130
