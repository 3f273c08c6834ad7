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
only): what the no-op operations alone add. The shell loop is calibrated on the lab first (two
warm-up runs, a line through them), then checked: the printed host CPU is what was measured.
With ``--named`` the lab is converged by ``deploy/full.py`` first and a third shape, ``named``,
is the real named no-op run (bench_fleet's ``noop_run``: it must change nothing); the loop then
burns the host CPU that run measured, and the shapes' timed runs are interleaved, so the three
are compared on one lab at one time (the 8-host converge leaves the machine busy for a while).

Needs root; a lab instance of its own (``--instance``, default ``floor``: hosts up, nothing
installed on them; down at the end). Nothing is asserted; numbers are printed.
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
    return {
        **numbers,
        "host_cpu_per_host_s": numbers["host_cpu_total_s"] / len(numbers["host_cpu_s"]),
    }


def calibrate(where: Path, deploys: list[str], host_cpu: float) -> int:
    """Shell-loop iterations that make a run's host CPU per host ``host_cpu`` (the ``bare`` shape:
    connect, the fact, take and release), from a line through two runs."""
    low, high = 200_000, 1_000_000
    at_low = run_once(where, deploys, low, "bare")["host_cpu_per_host_s"]
    at_high = run_once(where, deploys, high, "bare")["host_cpu_per_host_s"]
    per_loop = (at_high - at_low) / (high - low)
    return max(0, round(low + (host_cpu - at_low) / per_loop))


def named_run() -> dict:
    """The real named no-op run on the converged lab, measured by bench_fleet."""
    result, numbers = fleet.noop_run("named", len(fleet.host_roots()))
    return {**with_per_host(numbers), "operations": len(result.operations)}


def summary(timed: list[dict]) -> dict:
    first = timed[0]
    numbers = [k for k in first if isinstance(first[k], int | float) and k != "hosts_settled"]
    return {k: statistics.median(r[k] for r in timed) for k in numbers}


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
            loops = calibrate(where, deploys, host_cpu)
            doc["loops"] = loops
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
                ratios = ", ".join(f"{r['wall_over_floor']:.3f}" for r in timed)
                doc["shapes"][shape] = {"median": med, "runs": timed}
                print(f"  {shape:>5}: wall {med['wall_s']:.2f} s, controller CPU "
                      f"{med['controller_cpu_s']:.2f} s ({med['controller_cpu_s'] / args.hosts:.3f}"
                      f" per host), host CPU {med['host_cpu_per_host_s']:.2f} s per host, floor "
                      f"{med['cpu_floor_s']:.2f} s, wall / floor {med['wall_over_floor']:.3f}"
                      f" (runs: {ratios})",
                      flush=True)  # fmt: skip
    finally:
        fleet.lab("down")
        doc["loadavg_after"] = os.getloadavg()
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
