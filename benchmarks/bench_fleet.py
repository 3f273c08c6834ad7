"""No-op provisioning on the simulated lab: wall time at 1, 4 and 8 hosts, remote commands per
host, bytes downloaded and bytes hashed on a re-run. Prints numbers; asserts nothing.

    python benchmarks/bench_fleet.py [--sizes 1,4,8] [--repeat 3]

CPU seconds are the whole machine's (the lab's hosts and the controller share its cores) and
the controller's (the pyinfra process) alone. Remote commands per host are counted for
deploy/full.py and for the four deploys named in one call.

For each size: a fresh lab of N x (4xP40) hosts, one converging run of deploy/full.py (the
controller's Apex wheel cache is kept between sizes, as in a real fleet), then ``--repeat``
no-op runs, timed; one more with ``--debug`` counts the commands sent to each host and whether
any of them hashed an artifact. Targets (issue): 8-host/1-host ratio <= 1.3, <= 25 remote
commands per host, 0 bytes downloaded and 0 GB hashed on a re-run. Needs root; leaves the lab
down.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from p40lab import runs  # noqa: E402

NAMED_ONE_BY_ONE = ("deploy/preflight.py", "deploy/system.py", "deploy/python.py",
                    "deploy/training.py")  # fmt: skip
_COMMAND = re.compile(r"Running command on (?P<host>\S+): \(pty=\w+\) (?P<cmd>.*)")


def lab(*argv: str) -> None:
    subprocess.run([sys.executable, "-m", "p40lab", *argv], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip


def commands_per_host(output: str) -> tuple[Counter, int]:
    counts: Counter = Counter()
    hashing = 0
    for line in output.splitlines():
        if m := _COMMAND.search(line):
            counts[m["host"]] += 1
            hashing += "sha256sum" in m["cmd"]
    return counts, hashing


def machine_cpu_seconds() -> float:
    """CPU seconds used by the whole machine since boot (user + nice + system, /proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return (int(fields[0]) + int(fields[1]) + int(fields[2])) / os.sysconf("SC_CLK_TCK")


def controller_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def noop_runs(size: int, repeat: int, env: dict | None = None) -> tuple[list, list, list, int]:
    """Wall seconds, machine CPU seconds and controller CPU seconds of ``repeat`` no-op runs."""
    times, machine, controller, served = [], [], [], 0
    for _ in range(repeat):
        m0, c0 = machine_cpu_seconds(), controller_cpu_seconds()
        again = runs.run("deploy/full.py", env=env)
        machine.append(machine_cpu_seconds() - m0)
        controller.append(controller_cpu_seconds() - c0)
        changed = {h: again.changed[h] for h in again.connected if again.changed[h]}
        if changed or any(again.errors.values()) or len(again.connected) != size:
            raise SystemExit(f"{size} hosts: the re-run was not a no-op: {changed}\n"
                             f"{again.output[-3000:]}")  # fmt: skip
        times.append(again.seconds)
        served += again.bytes_served or 0
    return times, machine, controller, served


def measure(size: int, repeat: int) -> dict:
    lab("down")
    lab("up", "--gpus", ",".join(["4xP40"] * size))
    first = runs.run("deploy/full.py")
    failed = [h for h in first.connected if first.errors[h]]
    if failed:
        raise SystemExit(f"{size} hosts: the converging run failed on {failed}")
    times, machine, controller, served = noop_runs(size, repeat)
    debug = runs.run("deploy/full.py", "--debug")
    counts, hashing = commands_per_host(debug.output)
    named = runs.run(*NAMED_ONE_BY_ONE, "--debug")
    named_counts, _ = commands_per_host(named.output)
    return {
        "hosts": size,
        "first": first.seconds,
        "noop_median": statistics.median(times),
        "noop_all": times,
        "machine_cpu": statistics.median(machine),
        "controller_cpu": statistics.median(controller),
        "named_commands_per_host": max(named_counts.values()) if named_counts else 0,
        "commands_per_host": max(counts.values()) if counts else 0,
        "bytes": served + (debug.bytes_served or 0),
        "hash_commands": hashing,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,4,8")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    results = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            r = measure(size, args.repeat)
            results.append(r)
            print(
                f"{r['hosts']} host(s): converge {r['first']:.1f} s; no-op median "
                f"{r['noop_median']:.1f} s ({', '.join(f'{t:.1f}' for t in r['noop_all'])}); "
                f"CPU s machine {r['machine_cpu']:.1f}, controller {r['controller_cpu']:.1f}; "
                f"remote commands per host {r['commands_per_host']} (the four deploys named: "
                f"{r['named_commands_per_host']}); re-run bytes "
                f"downloaded {r['bytes']}; hashing commands on re-run {r['hash_commands']}",
                flush=True,
            )
    finally:
        lab("down")
    by_size = {r["hosts"]: r for r in results}
    if 1 in by_size and 8 in by_size:
        ratio = by_size[8]["noop_median"] / by_size[1]["noop_median"]
        print(f"no-op wall time 8 hosts / 1 host: {ratio:.2f} (target <= 1.3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
