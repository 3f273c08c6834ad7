"""verify --collective's own code path on this machine's GPUs (issue 25, section 3).

The job ``facts.collective.CollectiveRunFact`` runs on a Ray head (``files/verify-collective.sh.j2``
rendered by ``collective_script.render_job``), with address ``local``: the driver starts a
private Ray here and runs ``--ranks`` ranks on this node, one GPU each, NCCL (``sh JOB no``); the
output is read by ``collective.parse_collective`` and judged by ``collective.collective_checks``
(floor: the pin's default). Here it runs as root (a host runs it as the training user).

On the device, after ``run_ppo.py`` staged the env (``/tmp/p40stage/site``: torch, ray)::

    python3 benchmarks/gpu_ppo/collective.py --ranks 1 --out $OUT     # nvidia-h200
    python3 benchmarks/gpu_ppo/collective.py --ranks 2 --out $OUT     # nvidia-h200-x2

One rank: the NCCL path runs end to end, busbw is 0 by definition (no link), the group SKIPs;
two ranks on one host measure NVLink/PCIe between two GPUs, not a network. ``--sim`` runs the
same job with gloo on CPU (what a lab host runs), e.g. locally with a python that has torch and
ray: ``PY=/path/bin/python; $PY benchmarks/gpu_ppo/collective.py --ranks 2 --sim --site ''``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--sim", action="store_true", help="gloo on CPU (a simulated host's job)")
    parser.add_argument("--site", default="/tmp/p40stage/site", help="torch + ray ('' : none)")
    parser.add_argument("--plan-site", default="/tmp/p40stage/plan-site")
    parser.add_argument("--timeout-s", type=int, default=300)
    parser.add_argument("--out", default=os.environ.get("OUT") or "docs/measurements")
    args = parser.parse_args(argv)
    for path in (args.plan_site, str(REPO)):
        if path and path not in sys.path:
            sys.path.insert(0, path)
    from p40fleet.spec import load_spec
    from p40fleet.verification import collective
    from p40fleet.verification.collective_script import LOCAL, CollectiveTargets, render_job

    spec = load_spec("device", {})
    members = tuple((f"rank{i}", "127.0.0.1") for i in range(args.ranks))
    targets = CollectiveTargets("root", sys.executable, LOCAL, "127.0.0.1",
                                spec.ray.collective_port, members, args.timeout_s)  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"collective-{args.ranks}x{'cpu' if args.sim else 'gpu'}"
    job = out / f"{name}.sh"
    job.write_text(render_job(targets))
    env = dict(os.environ)
    if args.site:
        env["PYTHONPATH"] = args.site
    t0 = time.monotonic()
    proc = subprocess.run(["sh", str(job), "yes" if args.sim else "no"], capture_output=True,
                          text=True, env=env, timeout=args.timeout_s + 60)  # fmt: skip
    (out / f"{name}.log").write_text(proc.stdout + proc.stderr)
    run = collective.parse_collective(proc.stdout.splitlines())
    checks = collective.collective_checks(
        run, head="device", floor_gbs=spec.ray.collective_min_busbw_gbs, timeout_s=args.timeout_s
    )
    summary = {
        "checks": [c.to_dict() for c in checks],
        "ranks": {
            r.name: {"ip": r.ip, "times_s": dict(r.times), "error": r.error}
            for r in run.ranks.values()
        },
        "values": dict(run.values),
        "job_sha256": hashlib.sha256(job.read_bytes()).hexdigest(),
        "run_s": round(time.monotonic() - t0, 1),
        "ok": bool(checks) and all(c.status != "FAIL" for c in checks),
    }
    (out / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    for check in checks:
        print(f"{check.name}: {check.status} {check.detail}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
