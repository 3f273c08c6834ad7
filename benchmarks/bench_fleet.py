"""No-op provisioning on the simulated lab: what a re-run of a converged fleet costs, per mode.

    python benchmarks/bench_fleet.py [--sizes 1,4,8] [--repeat 3] [--modes full,named]
                                     [--instance bench] [--json PATH]

For each size: a fresh lab of N x (4xP40) hosts in its own lab instance (``--instance``, default
``bench``: ``$P40LAB_INSTANCE``, so the default lab and the tests' ``test`` instance are left
alone; ``--instance ''`` uses the default lab), one converging run of deploy/full.py (the
controller's Apex wheel cache is kept between sizes, as in a real fleet), then for each mode one
untimed no-op run (a warm-up), ``--repeat`` timed no-op runs and one more with ``--debug`` that
counts the commands. Every no-op run must end with every host connected, 0 changed and 0
failed, or the benchmark stops. Modes:

* ``full``: ``pyinfra -y INV deploy/full.py`` (verification included);
* ``named``: ``pyinfra -y INV deploy/preflight.py deploy/system.py deploy/python.py
  deploy/training.py``, the same four deploys named one by one in one call (no verification).

Numbers, per size and mode (medians of the timed runs):

* **remote commands per host**: ``Running command on HOST`` lines of the ``--debug`` run, the
  most any host got (facts and operations alike; a no-op uploads nothing). Target <= 3.
* **controller CPU s per host**: user + system CPU of the pyinfra process and its children
  (``RUSAGE_CHILDREN`` of this process across the run) / hosts. Not counted: the lab's mirror
  server (a separate process; a no-op downloads nothing), the kernel's network work. With two
  sizes or more, also **per added host**: (total at the largest size - total at the smallest) /
  (difference in hosts), which leaves out what a run pays once (interpreter, imports, inventory,
  spec). Target <= 0.15.
* **host CPU s**: per lab host, user + system CPU of every process chrooted into that host's
  rootfs (``/proc/PID/root`` is the host's ``root`` in the lab state), with what their exited
  children used (``cutime + cstime``): the host's PID 1 is its sshd, which reaps each ssh
  session and, as the pid namespace's init, every orphan, so a session's shell, ``sudo`` and
  the commands it ran are all counted once they exit; the benchmark waits until each host is
  back to the processes it had before the run. Not counted: the host's netns networking done by
  the kernel (softirq), the supervisor and ``unshare`` outside the host, and CPU of a process
  of the host that exited unreaped (none on a no-op run). Read from ``/proc``, so other
  processes on this machine (other users' tests) do not enter it.
* **CPU floor** = host CPU s summed over all hosts / cores (``os.sched_getaffinity``): the
  least wall time the hosts' own work needs on this machine. **wall / floor** is the no-op wall
  time over it, per run, median. Target <= 1.2.
* Also: wall time, the whole machine's CPU seconds (``/proc/stat``; anything else running on
  the machine is in it), bytes downloaded from the mirror on re-runs and ``sha256sum`` commands
  sent on the ``--debug`` run (targets 0 and 0), and, when sizes 1 and 8 both ran, the 8-host /
  1-host no-op wall time ratio (target <= 1.3).

Targets are printed next to the numbers (PASS / FAIL); nothing is asserted. ``--json PATH``
writes every number, the per-run values and the load average before and after (the machine is
shared: a busy machine inflates wall time, not the CPU counts). Needs root; leaves the instance
down, its host disks wiped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from p40lab import runs  # noqa: E402

MODES = {
    "full": ("deploy/full.py",),
    "named": ("deploy/preflight.py", "deploy/system.py", "deploy/python.py", "deploy/training.py"),
}
TARGET_COMMANDS = 3
TARGET_CONTROLLER_CPU = 0.15
TARGET_WALL_OVER_FLOOR = 1.2
TARGET_SIZE_RATIO = 1.3

_COMMAND = re.compile(r"Running command on (?P<host>\S+): \(pty=\w+\) (?P<cmd>.*)")
_TICK = os.sysconf("SC_CLK_TCK")
T = TypeVar("T")


def lab(*argv: str) -> None:
    subprocess.run([sys.executable, "-m", "p40lab", *argv], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip


def state_path() -> Path:
    """The lab state file of ``$P40LAB_INSTANCE`` (the rule documented in p40lab/state.py)."""
    if os.environ.get("P40LAB_STATE"):
        return Path(os.environ["P40LAB_STATE"])
    instance = os.environ.get("P40LAB_INSTANCE", "").strip()
    lab_dir = os.environ.get("P40LAB_DIR", "/var/lib/p40lab" + (f"-{instance}" if instance else ""))
    return Path(lab_dir) / "state.json"


def host_roots() -> dict[str, str]:
    """``{host name: its rootfs on the controller}`` of the running lab."""
    data = json.loads(state_path().read_text())
    return {h["name"]: h["root"] for h in data["hosts"]}


def _proc_stats() -> Iterator[tuple[Path, list[str]]]:
    """Each process's ``/proc/PID`` and its ``stat`` fields after the command name (state first)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            yield entry, (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone


def host_processes(roots: dict[str, str]) -> dict[str, dict[int, float]]:
    """``{host: {pid: CPU s of the process and its reaped children}}``, processes chrooted there."""
    by_root = {root.rstrip("/"): name for name, root in roots.items()}
    found: dict[str, dict[int, float]] = {name: {} for name in roots}
    for entry, fields in _proc_stats():
        try:
            name = by_root.get(os.readlink(entry / "root"))
        except OSError:
            continue  # gone, or a zombie (no root link): its parent counts it once reaped
        if name is None:
            continue
        utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
        found[name][int(entry.name)] = (utime + stime + cutime + cstime) / _TICK
    return found


def unreaped(pids: set[int]) -> list[int]:
    """Zombies whose parent is one of ``pids``: an exited ssh session whose CPU its parent (the
    host's sshd) has not yet taken into its ``cutime``. A zombie has no ``root`` link, so
    :func:`host_processes` cannot see it: read then, the host's whole run reads 0 s and the
    next run gets it twice (2 of 15 runs of bench_pyinfra_floor on 2026-12-04)."""
    return [
        int(e.name) for e, fields in _proc_stats() if fields[0] == "Z" and int(fields[1]) in pids
    ]


def settle(roots: dict[str, str], idle: dict[str, dict[int, float]], timeout: float = 15) -> bool:
    """Wait until every host runs no process it did not run before (its ssh sessions ended) and
    every session that ended was reaped."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = host_processes(roots)
        if all(set(now[h]) <= set(idle[h]) for h in roots) and not unreaped(
            {pid for pids in now.values() for pid in pids}
        ):
            return True
        time.sleep(0.1)
    return False


def commands_per_host(output: str) -> tuple[Counter, int, dict[str, list[str]]]:
    """Commands sent to each host, ``sha256sum`` commands among them, and each host's list."""
    counts: Counter = Counter()
    hashing = 0
    sent: dict[str, list[str]] = {}
    for line in output.splitlines():
        if m := _COMMAND.search(line):
            counts[m["host"]] += 1
            hashing += "sha256sum" in m["cmd"]
            sent.setdefault(m["host"], []).append(m["cmd"][:300])
    return counts, hashing, sent


def machine_cpu_seconds() -> float:
    """CPU seconds used by the whole machine since boot (user + nice + system, /proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return (int(fields[0]) + int(fields[1]) + int(fields[2])) / _TICK


def controller_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cores() -> int:
    return len(os.sched_getaffinity(0))


def measured(run: Callable[[], tuple[T, float]]) -> tuple[T, dict]:
    """``run()`` (which returns its result and its wall seconds) with this benchmark's numbers:
    controller, host and machine CPU, the CPU floor and wall / floor (see the module doc)."""
    roots = host_roots()
    idle = host_processes(roots)
    m0, c0 = machine_cpu_seconds(), controller_cpu_seconds()
    result, wall = run()
    controller = controller_cpu_seconds() - c0
    settled = settle(roots, idle)
    machine = machine_cpu_seconds() - m0
    after = host_processes(roots)
    host_cpu = {h: sum(after[h].values()) - sum(idle[h].values()) for h in roots}
    host_total = sum(host_cpu.values())
    floor = host_total / cores()
    return result, {
        "wall_s": wall,
        "controller_cpu_s": controller,
        "host_cpu_s": host_cpu,
        "host_cpu_total_s": host_total,
        "cpu_floor_s": floor,
        "wall_over_floor": wall / floor if floor else None,
        "machine_cpu_s": machine,
        "hosts_settled": settled,
    }


def noop_run(mode: str, size: int, *args: str) -> tuple[runs.RunResult, dict]:
    """One no-op run of ``mode``, measured; stops the benchmark when it was not a no-op."""
    deploys = MODES[mode]

    def run() -> tuple[runs.RunResult, float]:
        result = runs.run(deploys[0], *deploys[1:], *args)
        return result, result.seconds

    result, numbers = measured(run)
    changed = {h: result.changed[h] for h in result.connected if result.changed[h]}
    failed = {h: result.errors[h] for h in result.connected if result.errors[h]}
    if changed or failed or len(result.connected) != size or result.returncode:
        raise SystemExit(
            f"{size} hosts, mode {mode}: the re-run was not a no-op (rc {result.returncode}, "
            f"{len(result.connected)} connected, changed {changed}, failed {failed})\n"
            f"{result.output[-3000:]}"
        )
    return result, {**numbers, "bytes_served": result.bytes_served}


def measure_mode(mode: str, size: int, repeat: int) -> dict:
    noop_run(mode, size)  # warm-up: the first no-op run after a converge is not timed
    timed = [noop_run(mode, size)[1] for _ in range(repeat)]
    debug, last = noop_run(mode, size, "--debug")
    counts, hashing, sent = commands_per_host(debug.output)
    med = statistics.median
    ratios = [r["wall_over_floor"] for r in timed if r["wall_over_floor"] is not None]
    return {
        "mode": mode,
        "argv": list(MODES[mode]),
        "commands_per_host": max(counts.values()) if counts else 0,
        "commands_by_host": dict(sorted(counts.items())),
        "hash_commands": hashing,
        # what the busiest host was sent (first 300 characters of each), to see what to cut
        "commands_sent": max(sent.values(), key=len) if sent else [],
        "wall_s": med(r["wall_s"] for r in timed),
        "controller_cpu_per_host_s": med(r["controller_cpu_s"] for r in timed) / size,
        "host_cpu_per_host_s": med(r["host_cpu_total_s"] for r in timed) / size,
        "host_cpu_total_s": med(r["host_cpu_total_s"] for r in timed),
        "cpu_floor_s": med(r["cpu_floor_s"] for r in timed),
        "wall_over_floor": med(ratios) if ratios else None,
        "machine_cpu_s": med(r["machine_cpu_s"] for r in timed),
        "bytes": sum(r["bytes_served"] or 0 for r in [*timed, last]),
        "runs": timed,
        "debug_run": last,
    }


def measure(size: int, repeat: int, modes: list[str], log) -> dict:
    lab("down")
    lab("up", "--gpus", ",".join(["4xP40"] * size))
    first = runs.run("deploy/full.py")
    failed = [h for h in first.connected if first.errors[h]]
    if failed or len(first.connected) != size or first.returncode:
        raise SystemExit(f"{size} hosts: the converging run failed on {failed or 'connect'}\n"
                         f"{first.output[-3000:]}")  # fmt: skip
    result = {"hosts": size, "converge_s": first.seconds, "modes": {}}
    for mode in modes:
        result["modes"][mode] = measure_mode(mode, size, repeat)
        log(result)
    return result


def verdict(value: float | None, target: float) -> str:
    if value is None:
        return "n/a"
    return f"{'PASS' if value <= target else 'FAIL'} (target <= {target:g})"


def report(r: dict) -> str:
    lines = [f"{r['hosts']} host(s) of 4xP40: converge {r['converge_s']:.1f} s"]
    for mode, m in r["modes"].items():
        walls = ", ".join(f"{x['wall_s']:.1f}" for x in m["runs"])
        ratio = m["wall_over_floor"]
        lines += [
            f"  {mode} ({' '.join(m['argv'])}):",
            f"    remote commands per host     {m['commands_per_host']:>8}    "
            f"{verdict(m['commands_per_host'], TARGET_COMMANDS)}",
            f"    controller CPU s per host    {m['controller_cpu_per_host_s']:>8.3f}    "
            f"{verdict(m['controller_cpu_per_host_s'], TARGET_CONTROLLER_CPU)}",
            f"    host CPU s per host          {m['host_cpu_per_host_s']:>8.3f}",
            f"    CPU floor s (hosts / {cores()} cores) {m['cpu_floor_s']:>8.2f}",
            f"    no-op wall s                 {m['wall_s']:>8.2f}    ({walls})",
            f"    wall / CPU floor             {ratio if ratio is None else f'{ratio:.2f}':>8}    "
            f"{verdict(ratio, TARGET_WALL_OVER_FLOOR)}",
            f"    machine CPU s (all processes) {m['machine_cpu_s']:>7.1f}",
            f"    re-run bytes downloaded      {m['bytes']:>8}    {verdict(m['bytes'], 0)}",
            f"    sha256sum commands           {m['hash_commands']:>8}    "
            f"{verdict(m['hash_commands'], 0)}",
        ]
    return "\n".join(lines)


def git_commit() -> str:
    out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, text=True,
                         capture_output=True)  # fmt: skip
    return out.stdout.strip() or "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,4,8")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--modes", default="full,named", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--instance", default="bench", help="lab instance ('' = the default lab)")
    ap.add_argument("--json", type=Path, help="write the numbers here")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {unknown}: choose from {', '.join(MODES)}")
    os.environ["P40LAB_INSTANCE"] = args.instance  # for this process, the lab CLI and pyinfra
    doc = {
        "commit": git_commit(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "instance": args.instance,
        "cores": cores(),
        "repeat": args.repeat,
        "loadavg_before": os.getloadavg(),
        "targets": {
            "commands_per_host": TARGET_COMMANDS,
            "controller_cpu_per_host_s": TARGET_CONTROLLER_CPU,
            "wall_over_floor": TARGET_WALL_OVER_FLOOR,
            "noop_8_over_1": TARGET_SIZE_RATIO,
        },
        "results": [],
    }

    def save(partial: dict | None = None) -> None:
        if args.json:
            out = {**doc, "results": doc["results"] + ([partial] if partial else [])}
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(out, indent=1) + "\n")

    print(f"commit {doc['commit']}, {doc['cores']} cores, load average before "
          f"{' '.join(f'{x:.2f}' for x in doc['loadavg_before'])}", flush=True)  # fmt: skip
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            r = measure(size, args.repeat, modes, save)
            doc["results"].append(r)
            print(report(r), flush=True)
            save()
    finally:
        lab("down", "--wipe")  # an 8-host instance keeps ~19 GB of host disks otherwise
        doc["loadavg_after"] = os.getloadavg()
        save()
        print(f"load average after {' '.join(f'{x:.2f}' for x in doc['loadavg_after'])}")
    by_size = {r["hosts"]: r for r in doc["results"]}
    if 1 in by_size and 8 in by_size:
        for mode in set(by_size[1]["modes"]) & set(by_size[8]["modes"]):
            ratio = by_size[8]["modes"][mode]["wall_s"] / by_size[1]["modes"][mode]["wall_s"]
            doc.setdefault("noop_8_over_1", {})[mode] = ratio
            print(f"{mode}: no-op wall time 8 hosts / 1 host {ratio:.2f} "
                  f"{verdict(ratio, TARGET_SIZE_RATIO)}")  # fmt: skip
    sizes = sorted(by_size)
    if len(sizes) >= 2:
        small, large = by_size[sizes[0]], by_size[sizes[-1]]
        for mode in set(small["modes"]) & set(large["modes"]):
            # What one more host costs the controller: the start-up (imports, inventory, spec)
            # is paid once per run, so the slope between two sizes is the per-host figure.
            total = {r["hosts"]: r["modes"][mode]["controller_cpu_per_host_s"] * r["hosts"]
                     for r in (small, large)}  # fmt: skip
            slope = (total[large["hosts"]] - total[small["hosts"]]) / (
                large["hosts"] - small["hosts"]
            )
            doc.setdefault("controller_cpu_per_added_host_s", {})[mode] = slope
            print(f"{mode}: controller CPU s per added host ({sizes[0]} -> {sizes[-1]} hosts) "
                  f"{slope:.3f} {verdict(slope, TARGET_CONTROLLER_CPU)}")  # fmt: skip
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
