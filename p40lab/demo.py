"""``make demo``: build the lab, provision it, provision it again, verify, and show the result.

    python -m p40lab.demo [--gpus 4xP40,8xP40,1xP100,2xH200]

The lab is left up afterwards (``python -m p40lab down`` stops it) so you can look around:
``python -m p40lab ssh lab1``. A lab already up is used as it is; a stale one (its processes
gone) is cleared by ``up``. One host of the default layout (2x H200) is refused on purpose:
driver R525 does not support the H200.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from rich.console import Console
from rich.table import Table

from p40lab import runs
from p40lab import state as st

console = Console()


def lab_up(gpus: str) -> None:
    running = [
        h["name"] for h in st.load().get("hosts", []) if st.pid_alive(h.get("supervisor_pid"))
    ]
    if running:
        console.print(f"[bold]lab already up[/] ({', '.join(running)}): using it as it is")
        return
    for argv in (["base"], ["up", "--gpus", gpus]):
        subprocess.run([sys.executable, "-m", "p40lab", *argv], cwd=runs.REPO, check=True)


def show(title: str, result: runs.RunResult) -> None:
    table = Table(title=f"{title}: pyinfra exit {result.returncode}, {result.seconds:.1f} s, "
                  f"{result.bytes_served or 0} bytes from the mirror")  # fmt: skip
    for column in ("host", "changed", "unchanged", "failed"):
        table.add_column(column)
    for host in result.connected:
        table.add_row(host, str(result.changed[host]), str(result.unchanged[host]),
                      str(result.errors[host]))  # fmt: skip
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m p40lab.demo")
    ap.add_argument("--gpus", default="4xP40,8xP40,1xP100,2xH200")
    args = ap.parse_args(argv)

    lab_up(args.gpus)
    console.rule("first run: pyinfra -y inventories/sim.py deploy/full.py")
    first = runs.run("deploy/full.py", echo=True)
    show("first run", first)
    console.rule("second run: must change nothing and download nothing")
    second = runs.run("deploy/full.py", echo=True)
    show("second run", second)
    console.rule("verification: python -m p40fleet.verify inventories/sim.py")
    verify = subprocess.run(
        [sys.executable, "-m", "p40fleet.verify", runs.SIM_INVENTORY, "--json",
         str(st.LAB_DIR / "verify-report.json")],
        cwd=runs.REPO,
    )  # fmt: skip
    # in the lab's order (lab1, lab2, ...: README's), not the order the hosts connected in
    order = [h["name"] for h in st.load().get("hosts", [])]
    hosts = sorted(second.connected, key=lambda h: order.index(h) if h in order else len(order))
    converged = [h for h in hosts if not second.errors[h] and not second.changed[h]]
    console.print(
        f"\n[bold]converged, second run unchanged:[/] {', '.join(converged) or 'none'}; "
        f"refused or failed: {', '.join(h for h in hosts if second.errors[h]) or 'none'}"
        f"; verify exit {verify.returncode} (report {st.LAB_DIR / 'verify-report.json'})"
    )
    console.print(
        f"the lab stays up: `{st.cli('status')}`, `{st.cli('ssh lab1')}`; "
        f"`{st.cli('down')}` stops it"
    )
    # Every host ends converged or refused (REFUSED by verify): a host that failed in the first
    # run, or was changed by the second, is the demo failing, even when others converged.
    try:
        report = json.loads((st.LAB_DIR / "verify-report.json").read_text())
        refused = {h for h, entry in report["hosts"].items() if entry["verdict"] == "REFUSED"}
    except (OSError, ValueError, KeyError, AttributeError):
        refused = set()
    bad = sorted(
        h for h in first.connected if h not in refused and (first.errors[h] or h not in converged)
    )
    if bad:
        console.print(f"[bold red]not converged (and not refused): {', '.join(bad)}[/]")
    return 0 if converged and not bad else 1


if __name__ == "__main__":
    sys.exit(main())
