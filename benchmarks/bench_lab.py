"""Benchmark the simulated lab: base build, up/down, ssh, pyinfra, reboot, reinstall, leftovers.

    python benchmarks/bench_lab.py [--cycles 3] [--gpus 4xP40,8xP40,1xP100,2xH200]
                                   [--rebuild-base] [--mirror]

Needs root and no lab up. The base is only rebuilt with ``--rebuild-base`` (~30 s, needs the
Debian archive); otherwise its recorded build time is reported. The mirror hook is skipped
unless ``--mirror`` (it measures the lab, not the doubles). Targets: 4 hosts up <= 5 s.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from p40lab import base, hosts, plan, procs  # noqa: E402
from p40lab import state as st  # noqa: E402
from p40lab.util import require_root  # noqa: E402


def timed(fn, *args, **kw) -> float:
    t0 = time.monotonic()
    fn(*args, **kw)
    return time.monotonic() - t0


def ssh_once(host: dict) -> None:
    subprocess.run(hosts.ssh_argv(host, "true"), check=True, stdin=subprocess.DEVNULL)


def pyinfra_exec(n_hosts: int) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "inventories/sim.py", "exec", "--", "true"],
        cwd=REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    ran = len(set(re.findall(r"\[(lab\d+)\]\s+Success", proc.stdout + proc.stderr)))
    if proc.returncode != 0 or ran != n_hosts:
        raise SystemExit(f"pyinfra ran on {ran}/{n_hosts} hosts:\n{proc.stdout}{proc.stderr}")


def summary(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:6.2f} s  (min {min(values):.2f}, max {max(values):.2f}, n={len(values)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--gpus", default=plan.DEFAULT_LAYOUTS)
    ap.add_argument("--hosts", type=int, default=None)
    ap.add_argument("--rebuild-base", action="store_true")
    ap.add_argument("--mirror", action="store_true")
    args = ap.parse_args()
    require_root()
    if st.is_up() or procs.lab_processes():
        raise SystemExit("a lab is up: run `python -m p40lab down` first")

    results: dict[str, list[float]] = {}
    add = lambda key, v: results.setdefault(key, []).append(v)  # noqa: E731

    if args.rebuild_base:
        add("base build (uncached)", base.build(force=True) or 0.0)
    else:
        recorded = base.build_info().get("seconds")
        if recorded is None:
            add("base build (uncached)", base.build() or 0.0)
        else:
            print(f"base build (uncached, recorded at its build): {recorded} s")
    add("base build (cached check)", timed(base.build))

    specs = plan.plan(args.hosts, args.gpus)
    n = len(specs)
    leftover_counts: list[dict[str, int]] = []
    try:
        for cycle in range(args.cycles):
            add(f"{n} hosts up (base cached)", timed(hosts.up, specs, mirror=args.mirror))
            data = st.load()
            h1 = data["hosts"][0]
            ssh_once(h1)  # warm
            add("ssh round trip", timed(ssh_once, h1))
            add(f"pyinfra exec on {n} hosts", timed(pyinfra_exec, n))
            if cycle == 0:
                add("reboot (until sshd answers)", hosts.reboot(h1["name"]))
                add("reinstall (until sshd answers)", hosts.reinstall(h1["name"]))
            t0 = time.monotonic()
            left = hosts.down()
            add(f"{n} hosts down", time.monotonic() - t0)
            leftover_counts.append({k: len(v) for k, v in left.items()})
    finally:
        if st.is_up():
            hosts.down()
    print()
    print(f"p40lab benchmark ({n} hosts: {args.gpus}; {args.cycles} cycles)")
    for key, values in results.items():
        print(f"  {key:34s} {summary(values)}")
    worst = {k: max(c[k] for c in leftover_counts) for k in leftover_counts[0]}
    print(f"  {'leftovers after down (max counts)':34s} {worst}")
    up_med = statistics.median(results[f"{n} hosts up (base cached)"])
    if n == 4:
        print(f"  target: 4 hosts up <= 5 s: {'OK' if up_med <= 5 else 'MISSED'} ({up_med:.2f} s)")
    return 0 if not any(worst.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
