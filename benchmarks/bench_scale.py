"""A no-op run and a verify-only run at 1, 8 and 32 lab hosts: what the controller pays per host.

    python benchmarks/bench_scale.py [--sizes 1,8,32] [--modes noop,verify] [--repeat 2]
                                     [--repeat-at 32=1] [--instance scale] [--converged]
                                     [--keep] [--json PATH]
    python benchmarks/bench_scale.py --clone-only 32 [--instance scale]
    python benchmarks/bench_scale.py --extrapolate A.json [B.json ...] [--hosts 1000]

Modes (a timed run must end with every host connected, 0 changed, 0 failed, exit 0; one that
does not is recorded under ``failures`` with its numbers and that mode runs at no larger size):

* ``noop``: the four provisioning deploys named in one call on converged hosts
  (``bench_fleet``'s ``named``: the survey, the run lock's take and release);
* ``verify``: ``pyinfra -y INV deploy/verify.py`` on the same hosts (one read-only probe per
  host: the check in the host's env imports torch, Apex and verl's trainer modules);
* ``full``: ``deploy/full.py`` (both in one run), not in the default modes.

**Converged hosts, cheaply.** Converging 8 hosts takes 5.5 min on this machine, 32 would take
over 20. So one host (``lab1``, 4xP40) is converged by ``deploy/full.py`` (unless
``--converged``: an earlier ``--keep`` run left it converged), and ``lab2``..``labN`` get a copy
of lab1's disk (its overlay upper layer, ``clone_disks``; ``--clone-only N`` makes them
beforehand, without the lab lock): hard links for the big trees nothing writes in place
(``LINKED``: the training user's home with the conda env, two library dirs, apt's cache), a
copy of every other file (the whole-disk hard link was tried first: ``p40lab up`` writes each
host's ssh host key in place, so every clone got the last one's). ``p40lab up --keep-disks``
then re-provisions each host's identity (hostname, /etc/hosts, its own ssh host key,
hardware), and a first untimed run per size (``settle_run``) may change what that reset. Each
host runs its own processes over its own copy of a converged disk, and every timed run must
change nothing. Not real: the linked trees' page cache is shared (a fleet reads its files from
32 disks). Controller numbers do not depend on that.

Numbers per run: wall; controller CPU (user + system of the pyinfra process, from ``wait4``);
its peak RSS (``ru_maxrss``); its most open file descriptors and sockets (``/proc/PID/fd``
sampled every 20 ms); the hosts' CPU (``bench_fleet.measured``: every process of each lab
host), the CPU floor (hosts' CPU / cores) and wall / floor; the load average before and after
each run (the machine is shared). ``--repeat`` timed runs per mode and size (``--repeat-at``
per size), after the settling run and, at the first size, one untimed warm-up per other mode.
``verify`` and ``full`` are skipped (``skipped``, with the arithmetic) at a size whose CPU floor
by the last size's host CPU per host exceeds the 120 s root allows a training-user fact command
(``probe_fits``; the probe is one): on 2 cores, 32 hosts x 9.5 s / 2 = 152 s.
Per mode over the sizes: a least-squares line ``a + b * hosts`` for controller CPU, RSS and
fds, ``b`` being the per-host figure.

``--extrapolate`` reads the ``--json`` files of earlier runs (one or several sessions, sizes
merged) and prints the 1,000-host extrapolation (``extrapolate()``; docs/scale.md shows the
arithmetic). Needs root for the lab runs; leaves the instance down, every disk wiped after a
complete run; ``--keep`` (or a run that stopped) keeps them for a later ``--converged`` run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

import bench_fleet as fleet  # noqa: E402

from p40fleet.privdrop import FACT_TIMEOUT_S  # noqa: E402
from p40lab import disks, runs  # noqa: E402

MODES = {
    "noop": fleet.MODES["named"],
    "verify": ("deploy/verify.py",),
    "full": fleet.MODES["full"],
}
LAYOUT = "4xP40"
SAMPLE_S = 0.02
FAILED_LOG = Path("/tmp/bench-scale-failed-run.log")
#: Modes whose probe runs as the training user under root's fact bound (FACT_TIMEOUT_S).
PROBED = ("verify", "full")
#: pyinfra 3.10, pyinfra/api/state.py: PARALLEL defaults to min(cpu_count() * 20, hosts,
#: MAX_PARALLEL), MAX_PARALLEL = round((RLIMIT_NOFILE soft - 10) / 3).
PARALLEL_PER_CPU = 20


# --------------------------------------------------------------------------- pure arithmetic


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``(a, b)`` of ``y = a + b * x`` through ``points`` (two x at least)."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        raise ValueError(f"a line needs two sizes at least, got {sorted(set(xs))}")
    mx = statistics.fmean(xs)
    my = statistics.fmean(y for _, y in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def pyinfra_default_parallel(cpus: int, hosts: int, nofile: int) -> int:
    """What pyinfra 3.10 runs at once without ``--parallel`` (pyinfra/api/state.py)."""
    return min(cpus * PARALLEL_PER_CPU, hosts, round((nofile - 10) / 3))


def extrapolate(lines: dict[str, tuple[float, float]], one_host_wall_s: float, hosts: int,
                cpus: int, nofile: int, parallel: int | None = None) -> dict:  # fmt: skip
    """One mode's run at ``hosts`` hosts, from the measured lines ``a + b * hosts`` of
    ``controller_cpu_s``, ``peak_rss_mb`` and ``max_fds``, on a controller of ``cpus`` cores
    with ``ulimit -n`` ``nofile``, every host doing its own work on its own CPU (a real fleet).

    * ``parallel``: ``--parallel`` or pyinfra's default (``pyinfra_default_parallel``);
    * ``fds_needed``: the fds line at ``hosts``: pyinfra keeps every host's connection open
      from connect to the end, whatever ``--parallel``; ``nofile_ok``: it fits ``nofile``;
    * ``wall_hosts_s``: hosts waiting for a pool slot: ceil(hosts / parallel) rounds of one
      host's wall (the one-host run's, which includes the controller's start-up: an upper
      bound per round);
    * ``wall_controller_s``: the controller's CPU at ``hosts``, on one core (one process,
      gevent): the run cannot be faster;
    * ``wall_s``: the larger of the two (a lower bound: they overlap at best).
    """
    at = {name: a + b * hosts for name, (a, b) in lines.items()}
    par = parallel if parallel else pyinfra_default_parallel(cpus, hosts, nofile)
    rounds = math.ceil(hosts / par)
    wall_hosts = rounds * one_host_wall_s
    wall_controller = at["controller_cpu_s"]
    return {
        "hosts": hosts,
        "parallel": par,
        "controller_cpu_s": at["controller_cpu_s"],
        "controller_cpu_per_host_s": lines["controller_cpu_s"][1],
        "peak_rss_mb": at["peak_rss_mb"],
        "rss_per_host_mb": lines["peak_rss_mb"][1],
        "fds_needed": math.ceil(at["max_fds"]),
        "fds_per_host": lines["max_fds"][1],
        "nofile": nofile,
        "nofile_ok": math.ceil(at["max_fds"]) <= nofile,
        "rounds": rounds,
        "wall_hosts_s": wall_hosts,
        "wall_controller_s": wall_controller,
        "wall_s": max(wall_hosts, wall_controller),
    }


# --------------------------------------------------------------------------- the lab


def disks_dir() -> Path:
    """``…/hosts`` of the running instance (lab1's root is ``…/hosts/lab1/root``)."""
    return Path(fleet.host_roots()["lab1"]).parent.parent


#: Big trees of a converged host that neither ``p40lab up`` (provisioning) nor a no-op or
#: verify run writes in place: hard-linked to lab1's. Every other file gets its own copy.
LINKED = ("home/verl", "usr/lib/gcc", "usr/lib/x86_64-linux-gnu", "var/cache/apt")
CLONE_MARK = ".bench-scale-clone"


def clone_disks(hosts_dir: Path, size: int) -> dict:
    """lab2..lab``size`` get lab1's upper layer (the lab is down): hard-linked by ``cp -al``,
    then ``p40lab.disks.unshare``d outside ``LINKED``; seconds taken and files copied per host.

    A host whose disk is marked done (``CLONE_MARK``, by ``--clone-only`` or an earlier size)
    is left as it is: cloning 31 disks takes minutes of this machine's disk, so ``--clone-only``
    does it without holding the lab lock, before the measuring session."""
    t0 = time.monotonic()
    source = hosts_dir / "lab1" / "upper"
    copied, made = None, 0
    for index in range(2, size + 1):
        top = hosts_dir / f"lab{index}"
        if (top / CLONE_MARK).exists():
            continue
        shutil.rmtree(top, ignore_errors=True)
        top.mkdir(parents=True)
        copied = disks.clone_upper(source, top / "upper", LINKED)
        (top / CLONE_MARK).write_text(f"{source}\n")
        made += 1
    return {"clone_s": time.monotonic() - t0, "clones_made": made,
            "files_copied_per_host": copied, "linked": list(LINKED)}  # fmt: skip


def up(size: int, *, keep_disks: bool) -> None:
    fleet.lab("up", *(["--keep-disks"] if keep_disks else []), "--gpus", ",".join([LAYOUT] * size))


# --------------------------------------------------------------------------- one run


class Sampler(threading.Thread):
    """The most fds, sockets and RSS that process ``pid`` had, read every ``SAMPLE_S``."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.fds, self.sockets, self.rss_kb = pid, 0, 0, 0
        self.done = threading.Event()

    def run(self) -> None:
        fd_dir = Path(f"/proc/{self.pid}/fd")
        while not self.done.is_set():
            try:
                links = [os.readlink(p) for p in fd_dir.iterdir()]
                status = Path(f"/proc/{self.pid}/status").read_text()
            except OSError:
                links, status = [], ""  # gone (or between iterdir and readlink)
            self.fds = max(self.fds, len(links))
            self.sockets = max(self.sockets, sum(x.startswith("socket:") for x in links))
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    self.rss_kb = max(self.rss_kb, int(line.split()[1]))
            self.done.wait(SAMPLE_S)


def pyinfra_run(deploys: tuple[str, ...]) -> tuple[runs.RunResult, float, dict]:
    """``pyinfra -y INV DEPLOYS`` as ``p40lab.runs.run`` starts it, with its own rusage."""
    argv = [sys.executable, "-m", "pyinfra", "-y", runs.SIM_INVENTORY, *deploys]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, text=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    sampler = Sampler(proc.pid)
    sampler.start()
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()), daemon=True)
    reader.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    sampler.done.set()
    reader.join()
    sampler.join()
    output = "".join(chunks)
    connected, changed, unchanged, errors = runs.parse(output)
    result = runs.RunResult(argv, proc.returncode, wall, output, connected, changed, unchanged,
                            errors)  # fmt: skip
    own = {
        "controller_cpu_own_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "sampled_rss_mb": sampler.rss_kb / 1024,
        "max_fds": sampler.fds,
        "max_sockets": sampler.sockets,
    }
    return result, wall, own


class RunFailed(Exception):
    """A run that changed or failed something, or did not reach every host: its numbers kept."""

    def __init__(self, why: str, numbers: dict) -> None:
        super().__init__(why)
        self.why, self.numbers = why, numbers


def measured_run(mode: str, size: int, *, settling: bool = False) -> dict:
    """One run of ``mode``, measured; it must change nothing (``settling``: it may, see
    :func:`settle_run`) and fail nothing on every host, else :class:`RunFailed`."""
    own: dict = {}

    def run() -> tuple[runs.RunResult, float]:
        result, wall, numbers = pyinfra_run(MODES[mode])
        own.update(numbers)
        return result, wall

    load_before = os.getloadavg()
    result, numbers = fleet.measured(run)
    changed = {h: result.changed[h] for h in result.connected if result.changed[h]}
    failed = {h: result.errors[h] for h in result.connected if result.errors[h]}
    numbers.pop("host_cpu_s")  # per host names: the total is enough here
    numbers = {**numbers, **own, "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
    if (changed and not settling) or failed or len(result.connected) != size or result.returncode:
        FAILED_LOG.write_text(result.output)
        raise RunFailed(
            f"{size} hosts, mode {mode}: not a no-op (rc {result.returncode}, "
            f"{len(result.connected)} connected, changed {changed}, failed {failed}; the whole "
            f"output: {FAILED_LOG})",
            numbers,
        )
    if settling:
        ops = Counter(op for h in result.connected for op in result.changed_operations(h))
        numbers["changed_operations"] = dict(ops)
    return numbers


def settle_run(size: int) -> dict:
    """The first no-op run after ``p40lab up --keep-disks``: ``up`` re-provisions each host's
    identity and system doubles (p40lab.disks.provision), which resets what a deploy had put
    there, so this run may change that (it says what, per operation: host count); it is not
    timed. Every later run must change nothing."""
    return measured_run("noop", size, settling=True)


def probe_fits(host_cpu_per_host_s: float, hosts: int, cores: int,
               bound_s: float = FACT_TIMEOUT_S) -> bool:  # fmt: skip
    """Whether ``hosts`` lab hosts' probes can answer within root's bound on a training-user
    fact command (``bound_s``) when they share ``cores``: their CPU floor must fit in it."""
    return host_cpu_per_host_s * hosts / cores <= bound_s


def summarize(size: int, mode: str, timed: list[dict]) -> dict:
    med = statistics.median
    keys = ("wall_s", "controller_cpu_own_s", "peak_rss_mb", "max_fds", "max_sockets",
            "host_cpu_total_s", "cpu_floor_s", "wall_over_floor", "machine_cpu_s")  # fmt: skip
    out = {k: med(r[k] for r in timed if r[k] is not None) for k in keys}
    out["controller_cpu_per_host_s"] = out["controller_cpu_own_s"] / size
    out["host_cpu_per_host_s"] = out["host_cpu_total_s"] / size
    return {"hosts": size, "mode": mode, "median": out, "runs": timed}


# --------------------------------------------------------------------------- reports


def lines_of(results: list[dict], mode: str) -> dict[str, tuple[float, float]]:
    """Per measured quantity, the line ``a + b * hosts`` through every run of ``mode``."""
    lines = {}
    for key, name in (("controller_cpu_own_s", "controller_cpu_s"), ("peak_rss_mb", "peak_rss_mb"),
                      ("max_fds", "max_fds")):  # fmt: skip
        points = [(r["hosts"], run[key]) for r in results if r["mode"] == mode for run in r["runs"]]
        lines[name] = fit_line(points)
    return lines


def report_size(s: dict) -> str:
    m = s["median"]
    load = " ".join(f"{r['loadavg_before'][0]:.1f}" for r in s["runs"])
    return (
        f"{s['hosts']:>3} hosts {s['mode']:>6}: wall {m['wall_s']:6.1f} s, floor "
        f"{m['cpu_floor_s']:6.1f} s, wall/floor {m['wall_over_floor']:.2f}; controller CPU "
        f"{m['controller_cpu_own_s']:.2f} s ({m['controller_cpu_per_host_s']:.3f}/host), peak RSS "
        f"{m['peak_rss_mb']:.0f} MB, fds {m['max_fds']:.0f} (sockets {m['max_sockets']:.0f}); "
        f"host CPU {m['host_cpu_per_host_s']:.2f} s/host; load (1 min) before each run: {load}"
    )


def extrapolation_report(paths: list[Path], hosts: int, cpus: int, nofile: int) -> dict:
    results = [r for p in paths for r in json.loads(p.read_text())["results"]]
    out = {"from": [str(p) for p in paths], "hosts": hosts, "modes": {}}
    for mode in sorted({r["mode"] for r in results}):
        of_mode = [r for r in results if r["mode"] == mode]
        if len({r["hosts"] for r in of_mode}) < 2:
            continue
        lines = lines_of(of_mode, mode)
        one = min(of_mode, key=lambda r: r["hosts"])
        one_wall = one["median"]["wall_s"]
        cases = {
            f"{cpus} cores, ulimit -n {nofile}, default parallel": (cpus, nofile, None),
            f"{cpus} cores, ulimit -n {max(nofile, 4096)}, --parallel {hosts}":
                (cpus, max(nofile, 4096), hosts),
        }  # fmt: skip
        out["modes"][mode] = {
            "lines": {k: {"a": a, "b": b} for k, (a, b) in lines.items()},
            "one_host_wall_s": one_wall,
            "one_host_size": one["hosts"],
            "cases": {
                name: extrapolate(lines, one_wall, hosts, c, n, p)
                for name, (c, n, p) in cases.items()
            },  # fmt: skip
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,8,32")
    ap.add_argument("--modes", default="noop,verify", help=f"of {', '.join(MODES)}")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument(
        "--repeat-at",
        default="",
        metavar="SIZE=N,...",
        help="timed runs per mode at these sizes instead of --repeat",
    )
    ap.add_argument("--instance", default="scale", help="lab instance ('' = the default lab)")
    ap.add_argument(
        "--converged",
        action="store_true",
        help="lab1's kept disk is converged (an earlier --keep run): no converge",
    )
    ap.add_argument("--keep", action="store_true", help="keep lab1's disk at the end")
    ap.add_argument(
        "--clone-only",
        type=int,
        metavar="N",
        help="only clone lab1's kept disk to lab2..labN (lab down; no lab lock)",
    )
    ap.add_argument("--json", type=Path, help="write the numbers here")
    ap.add_argument("--extrapolate", type=Path, nargs="+", metavar="JSON")
    ap.add_argument("--hosts", type=int, default=1000, help="with --extrapolate")
    ap.add_argument("--cpus", type=int, default=os.cpu_count(), help="with --extrapolate")
    ap.add_argument("--nofile", type=int, default=1024, help="with --extrapolate")
    args = ap.parse_args()
    if args.extrapolate:
        out = extrapolation_report(args.extrapolate, args.hosts, args.cpus, args.nofile)
        text = json.dumps(out, indent=1) + "\n"
        if args.json:
            args.json.write_text(text)
        print(text, end="")
        return 0
    if args.clone_only:
        os.environ["P40LAB_INSTANCE"] = args.instance
        hosts_dir = fleet.state_path().parent / "hosts"
        if not (hosts_dir / "lab1" / "upper").is_dir():
            raise SystemExit(f"no lab1 disk in {hosts_dir}: run with --keep first")
        print(json.dumps(clone_disks(hosts_dir, args.clone_only)))
        return 0
    modes = [m for m in args.modes.split(",") if m]
    if unknown := [m for m in modes if m not in MODES]:
        ap.error(f"unknown mode(s) {unknown}: choose from {', '.join(MODES)}")
    sizes = [int(s) for s in args.sizes.split(",")]
    repeat_at = {int(k): int(v) for k, v in (x.split("=") for x in args.repeat_at.split(",") if x)}
    os.environ["P40LAB_INSTANCE"] = args.instance
    doc: dict = {
        "commit": fleet.git_commit(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "instance": args.instance,
        "cores": fleet.cores(),
        "nice": os.nice(0),
        "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "repeat": args.repeat,
        "repeat_at": repeat_at,
        "loadavg_before": os.getloadavg(),
        "clone": "lab2..labN: lab1's converged upper layer, hard-linked (cp -al)",
        "results": [],
        "failures": [],
        "skipped": [],
        "sessions": [],
    }

    def save() -> None:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(doc, indent=1) + "\n")

    print(f"commit {doc['commit']}, {doc['cores']} cores, nice {doc['nice']}, ulimit -n "
          f"{doc['nofile']}, load {' '.join(f'{x:.2f}' for x in doc['loadavg_before'])}",
          flush=True)  # fmt: skip
    completed = False
    try:
        fleet.lab("down")
        if args.converged:
            up(1, keep_disks=True)
        else:
            up(1, keep_disks=False)
            first = runs.run("deploy/full.py")
            if first.returncode or first.connected != ["lab1"] or first.errors["lab1"]:
                raise SystemExit(f"the converging run failed:\n{first.output[-3000:]}")
            doc["converge_s"] = first.seconds
            print(f"lab1 converged in {first.seconds:.1f} s", flush=True)
        hosts_dir = disks_dir()
        skip: dict[str, str] = {}  # mode -> why it runs no more
        host_cpu: dict[str, float] = {}  # mode -> host CPU s per host at the last size
        for index, size in enumerate(sizes):
            fleet.lab("down")
            session = {"hosts": size, **clone_disks(hosts_dir, size)}
            t0 = time.monotonic()
            up(size, keep_disks=True)
            session["up_s"] = time.monotonic() - t0
            doc["sessions"].append(session)
            try:
                session["settle"] = settle_run(size)
            except RunFailed as exc:  # the hosts are not converged: nothing to measure
                doc["failures"].append({"hosts": size, "mode": "settle", "why": exc.why,
                                        "run": exc.numbers})  # fmt: skip
                raise SystemExit(exc.why) from None
            print(f"{size} hosts: settling run changed {session['settle']['changed_operations']}",
                  flush=True)  # fmt: skip
            for mode in modes:
                if mode not in skip and mode in PROBED and mode in host_cpu:
                    if not probe_fits(host_cpu[mode], size, doc["cores"]):
                        skip[mode] = (
                            f"{size} hosts x {host_cpu[mode]:.2f} s of host CPU / {doc['cores']} "
                            f"cores > the probe's {FACT_TIMEOUT_S} s bound (FACT_TIMEOUT_S)"
                        )
                if mode in skip:
                    doc["skipped"].append({"hosts": size, "mode": mode, "why": skip[mode]})
                    print(f"{size:>3} hosts {mode:>6}: skipped: {skip[mode]}", flush=True)
                    continue
                try:
                    if index == 0 and mode != "noop":
                        measured_run(mode, size)  # warm-up (the settling run was noop's)
                    timed = [measured_run(mode, size)
                             for _ in range(repeat_at.get(size, args.repeat))]  # fmt: skip
                except RunFailed as exc:  # recorded; the other modes and sizes go on
                    doc["failures"].append({"hosts": size, "mode": mode, "why": exc.why,
                                            "run": exc.numbers})  # fmt: skip
                    skip[mode] = f"failed at {size} hosts"
                    print(exc.why, flush=True)
                    save()
                    continue
                doc["results"].append(summarize(size, mode, timed))
                host_cpu[mode] = doc["results"][-1]["median"]["host_cpu_per_host_s"]
                print(report_size(doc["results"][-1]), flush=True)
                save()
        completed = True
    finally:
        # A run that stopped keeps the disks: `--converged` goes on from them.
        wipe = completed and not args.keep
        fleet.lab("down", *(["--wipe"] if wipe else []))
        doc["loadavg_after"] = os.getloadavg()
        save()
        print(f"load after {' '.join(f'{x:.2f}' for x in doc['loadavg_after'])}")
    for mode in modes:
        if len({r["hosts"] for r in doc["results"] if r["mode"] == mode}) >= 2:
            lines = lines_of(doc["results"], mode)
            print(f"{mode}: " + ", ".join(f"{k} {a:.3f} + {b:.4f}/host"
                                          for k, (a, b) in lines.items()))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
