"""What pyinfra itself costs a named no-op run on this machine, with nothing of p40fleet in it.

    python benchmarks/bench_pyinfra_floor.py [--hosts 8] [--repeat 3] [--host-cpu 1.12] [--named]
                                             [--ops 2,19,18,3] [--instance floor] [--json PATH]

``benchmarks/bench_fleet.py`` measures the named no-op run (``pyinfra -y INV deploy/preflight.py
deploy/system.py deploy/python.py deploy/training.py``) against a floor: the hosts' CPU seconds
÷ cores. This benchmark runs the same *shape* with pyinfra's own operations only, so the two can
be compared: four deploy files named in one call, each host asked one fact command in the first
file (as the survey is) that burns ``--host-cpu`` seconds of the host's CPU in a shell loop,
then per host one operation sending a command (the run lock's take), ``--ops`` operations per
file that do nothing (``server.shell(commands=[])``: "No changes"), and a last one sending a
command (the lock's release). Defaults: 8 hosts, 43 operations per host as the named run has
(its "Starting operation" lines: the lock's take and the proxy step, then 20 + 18 + 3; its
release is a command sent after the last one, here an operation of its own: 2 + 19 + 18 + 3 +
the release) and its 1.12 s of host CPU per host (``docs/measurements/bench-fleet-after.json``).
With ``--named``, a count that differs from the named run's stops the benchmark. The same inventory
(``inventories/sim.py``), the same SSH, the same measuring as bench_fleet (its functions): wall
time, controller CPU (the pyinfra process), host CPU (every process of each lab host), wall /
floor.

Two shapes: ``ops`` (the operations above) and ``bare`` (the fact, the take and the release
only): what the no-op operations alone add. The shell loop is calibrated on the lab first (a
warm-up run, then secant steps until a run burns the target within 1.5 %), and every shape's
host CPU is printed as measured. The hosts do the same work, so a run's reading is its median
host's CPU and its floor is that × hosts ÷ cores: one host read wrong (0, or with another
process in it, as in 3 of 15 runs on 2026-12-04) is listed as misread and does not move
the floor.
With ``--named`` the lab is converged by ``deploy/full.py`` first and a third shape, ``named``,
is the real named no-op run (bench_fleet's ``noop_run``: it must change nothing); the loop then
burns the host CPU that run measured, and the shapes' timed runs are interleaved, so the three
are compared on one lab at one time (the 8-host converge leaves the machine busy for a while).
The last line then decides #29's bar: the named run's median wall / floor minus the
``ops`` shape's, PASS at most 0.05, and UNDECIDED when the two shapes' host readings differ by
more than 3 % (the floor scales with the reading, so more host CPU reads as a lower ratio).

Needs root; a lab instance of its own (``--instance``, default ``floor``: hosts up, nothing
installed on them; down and wiped at the end). Nothing is asserted; numbers are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_fleet as fleet  # noqa: E402

from p40lab import runs  # noqa: E402

FILES = ("preflight", "system", "python", "training")

_FIRST = '''"""The first file: one fact command per host (as the survey), then the lock's take."""
import os
from pyinfra import host
from pyinfra.facts.server import Command
from pyinfra.operations import server

loops = int(os.environ["FLOOR_LOOPS"])
host.get_fact(Command, f"i=0; while [ $i -lt {loops} ]; do i=$((i+1)); done; echo burnt")
server.shell(name="Take the lock (a command)", commands=["true"])
'''

_NOOPS = '''"""{count} operations that change nothing."""
import os
from pyinfra.operations import server

for i in range({count} if os.environ["FLOOR_SHAPE"] == "ops" else 0):
    server.shell(name=f"{name} step {{i}}", commands=[])
'''

_RELEASE = """server.shell(name="Release the lock (a command)", commands=["true"])
"""


def write_deploys(where: Path, ops: list[int]) -> list[str]:
    """The four deploy files, ``ops[i]`` no-op operations in file i (the first's count includes
    the lock's take, the last file ends with the release)."""
    (where / "deploy").mkdir(parents=True, exist_ok=True)
    names = []
    for index, name in enumerate(FILES):
        count = ops[index] - 1 if index == 0 else ops[index]
        text = (_FIRST if index == 0 else "") + _NOOPS.format(count=count, name=name)
        if index == len(FILES) - 1:
            text += _RELEASE
        (where / "deploy" / f"{name}.py").write_text(text)
        names.append(f"deploy/{name}.py")
    return names


def run_once(where: Path, deploys: list[str], loops: int, shape: str) -> dict:
    """One run, measured as bench_fleet measures a no-op run."""
    env = {
        **os.environ,
        "FLOOR_LOOPS": str(loops),
        "FLOOR_SHAPE": shape,
        "PYTHONPATH": str(REPO),
    }  # fmt: skip  (the inventory imports p40lab)
    pyinfra = str(Path(sys.executable).with_name("pyinfra"))

    def run() -> tuple[subprocess.CompletedProcess, float]:
        t0 = time.monotonic()
        proc = subprocess.run([pyinfra, "-y", str(REPO / "inventories" / "sim.py"), *deploys],
                              cwd=where, env=env, capture_output=True, text=True)  # fmt: skip
        return proc, time.monotonic() - t0

    proc, numbers = fleet.measured(run)
    if proc.returncode:
        raise SystemExit(f"pyinfra failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}"
                         f"{proc.stderr[-2000:]}")  # fmt: skip
    return with_per_host(numbers)


def with_per_host(numbers: dict) -> dict:
    """Add the hosts' reading: every host does the same work, so the median host's CPU is the
    reading and the floor is taken from it (``work_floor_s``). A host read 25 % off that median
    (a reading of 0, or one that took in another process) is listed in ``misread_hosts`` and
    does not move the comparison; ``cpu_floor_s`` (bench_fleet's, from the sum) is kept too."""
    per_host = numbers["host_cpu_s"]
    median = statistics.median(per_host.values())
    work_floor = median * len(per_host) / fleet.cores()
    return {
        **numbers,
        "host_cpu_per_host_s": median,
        "misread_hosts": sorted(h for h, s in per_host.items() if abs(s - median) > 0.25 * median),
        "work_floor_s": work_floor,
        "wall_over_work_floor": numbers["wall_s"] / work_floor if work_floor else None,
    }


def calibrate(
    where: Path, deploys: list[str], host_cpu: float, tolerance: float = 0.015, tries: int = 6
) -> tuple[int, float]:
    """Shell-loop iterations that make a run's host CPU per host ``host_cpu`` within
    ``tolerance``, and the reading they gave (the ``bare`` shape: connect, the fact, take and
    release). A warm-up run first (a cold run reads high and made a line through two runs
    overshoot, 1.12 s aimed at, 1.30 s burnt), then secant steps from the last two readings."""
    run_once(where, deploys, 200_000, "bare")
    points = [(loops, run_once(where, deploys, loops, "bare")["host_cpu_per_host_s"])
              for loops in (200_000, 1_000_000)]  # fmt: skip
    for _ in range(tries):
        (x0, y0), (x1, y1) = points[-2], points[-1]
        per_loop = (y1 - y0) / (x1 - x0) if x1 != x0 and y1 != y0 else y1 / max(x1, 1)
        loops = max(0, round(x1 + (host_cpu - y1) / per_loop))
        reading = run_once(where, deploys, loops, "bare")["host_cpu_per_host_s"]
        points.append((loops, reading))
        print(f"  calibrating: {loops} loops burn {reading:.3f} s per host "
              f"(aiming at {host_cpu:.3f})", flush=True)  # fmt: skip
        if abs(reading - host_cpu) <= tolerance * host_cpu:
            return loops, reading
    raise SystemExit(f"the shell loop did not reach {host_cpu:.3f} s per host within "
                     f"{tolerance:.1%} in {tries} tries: {points}")  # fmt: skip


def named_run() -> dict:
    """The real named no-op run on the converged lab, measured by bench_fleet."""
    result, numbers = fleet.noop_run("named", len(fleet.host_roots()))
    return {**with_per_host(numbers), "operations": len(result.operations)}


def summary(timed: list[dict]) -> dict:
    first = timed[0]
    numbers = [k for k in first if isinstance(first[k], int | float) and k != "hosts_settled"]
    return {k: statistics.median(r[k] for r in timed if r[k] is not None) for k in numbers}


#: #29's bar: the named run's wall / floor at most this much above pyinfra's own shape's.
BAR = 0.05
#: The shapes are compared only when their hosts' readings agree this closely: the floor scales
#: with the reading, so a shape that burnt more host CPU gets a lower wall / floor for it.
MATCHED = 0.03


def decide(shapes: dict) -> dict:
    """named vs ops: the difference of their median wall / floor against :data:`BAR`, decided
    only when the hosts' median readings match within :data:`MATCHED`."""
    named, ops = shapes["named"]["median"], shapes["ops"]["median"]
    gap = named["wall_over_work_floor"] - ops["wall_over_work_floor"]
    drift = abs(named["host_cpu_per_host_s"] / ops["host_cpu_per_host_s"] - 1)
    if drift > MATCHED:
        verdict = "UNDECIDED"
        why = f"host readings differ by {drift:.1%} (> {MATCHED:.0%}): calibrate again"
    else:
        verdict = "PASS" if gap <= BAR else "FAIL"
        why = f"host readings within {drift:.1%}"
    return {
        "gap": gap,
        "reading_drift": drift,
        "verdict": verdict,
        "line": f"  named - ops wall / floor: {gap:+.3f} (bar <= {BAR}): {verdict}, {why}",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--host-cpu", type=float, default=1.12, help="host CPU s per host to burn")
    ap.add_argument("--ops", default="2,19,18,3", help="operations per host in each of the 4 files")
    ap.add_argument("--named", action="store_true",
                    help="converge the lab first and measure the real named no-op run too, "
                         "interleaved; the shell loop then burns what it measured")  # fmt: skip
    ap.add_argument("--instance", default="floor", help="lab instance ('' = the default lab)")
    ap.add_argument("--json", type=Path, help="write the numbers here")
    args = ap.parse_args()
    ops = [int(x) for x in args.ops.split(",")]
    if len(ops) != len(FILES) or ops[0] < 1 or min(ops) < 0:
        ap.error("--ops: four counts, the first at least 1 (the lock's take)")
    os.environ["P40LAB_INSTANCE"] = args.instance
    doc: dict = {
        "commit": fleet.git_commit(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "hosts": args.hosts,
        "cores": fleet.cores(),
        "ops_per_host": sum(ops) + 1,
        "loadavg_before": os.getloadavg(),
        "shapes": {},
    }
    print(f"commit {doc['commit']}, {doc['cores']} cores, {args.hosts} hosts, "
          f"{doc['ops_per_host']} operations per host, load average before "
          f"{' '.join(f'{x:.2f}' for x in doc['loadavg_before'])}", flush=True)  # fmt: skip
    try:
        fleet.lab("down")
        fleet.lab("up", "--gpus", ",".join(["4xP40"] * args.hosts))
        shapes = ["bare", "ops"]
        host_cpu = args.host_cpu
        if args.named:
            converge = runs.run("deploy/full.py")
            if converge.returncode or len(converge.connected) != args.hosts:
                raise SystemExit(f"the converging run failed:\n{converge.output[-3000:]}")
            named_run()  # warm-up: the first no-op run after a converge is not timed
            first = named_run()
            if first["operations"] != doc["ops_per_host"]:
                raise SystemExit(
                    f"the named run has {first['operations']} operations per host, this shape "
                    f"{doc['ops_per_host']}: give --ops counts that add up to "
                    f"{first['operations'] - 1} (the release is the shape's last operation)"
                )
            host_cpu = first["host_cpu_per_host_s"]
            shapes.insert(0, "named")
        doc["host_cpu_target_s"] = host_cpu
        with tempfile.TemporaryDirectory(prefix="pyinfra-floor-") as tmp:
            where = Path(tmp)
            deploys = write_deploys(where, ops)
            loops, reading = calibrate(where, deploys, host_cpu)
            doc["loops"], doc["calibrated_host_cpu_s"] = loops, reading
            measured: dict[str, list[dict]] = {shape: [] for shape in shapes}
            for shape in shapes[1:]:
                run_once(where, deploys, loops, shape)  # warm-up
            for _ in range(args.repeat):  # interleaved: a load change hits every shape alike
                for shape in shapes:
                    measured[shape].append(
                        named_run() if shape == "named" else run_once(where, deploys, loops, shape)
                    )
            for shape, timed in measured.items():
                med = summary(timed)
                ratios = ", ".join(f"{r['wall_over_work_floor']:.3f}" for r in timed)
                misread = sorted({h for r in timed for h in r["misread_hosts"]})
                doc["shapes"][shape] = {"median": med, "runs": timed, "misread_hosts": misread}
                print(f"  {shape:>5}: wall {med['wall_s']:.2f} s, controller CPU "
                      f"{med['controller_cpu_s']:.2f} s ({med['controller_cpu_s'] / args.hosts:.3f}"
                      f" per host), host CPU {med['host_cpu_per_host_s']:.3f} s per host (median"
                      f" host), floor {med['work_floor_s']:.2f} s, wall / floor "
                      f"{med['wall_over_work_floor']:.3f} (runs: {ratios})"
                      + (f", misread: {', '.join(misread)}" if misread else ""),
                      flush=True)  # fmt: skip
            if args.named:
                doc["decision"] = decide(doc["shapes"])
                print(doc["decision"]["line"], flush=True)
    finally:
        fleet.lab("down", "--wipe")  # an 8-host instance keeps ~19 GB of host disks otherwise
        doc["loadavg_after"] = os.getloadavg()
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
