"""``python -m p40fleet.verify``: verify a fleet, print one table, exit 0 / 1 / 2.

    python -m p40fleet.verify INVENTORY [--json PATH] [--junit PATH] [--limit HOST]... [-v] [-q]
                                        [--smoke [--smoke-timeout S]]
                                        [--collective [--collective-timeout S]]

Runs ``python -m pyinfra -y INVENTORY deploy/verify.py`` (read-only: it changes nothing) with
the report path in ``$P40FLEET_REPORT``, then prints the fleet table from that report. ``--smoke``
(host data ``verify_smoke=yes``) adds one PPO step per host that passes the other checks
(``p40fleet.verification.smoke``): minutes per host, not read-only in /tmp (a scratch dir the
training user makes and removes). ``--collective`` (host data ``verify_collective=yes``) adds,
on the Ray head, one all-reduce over the cluster's training nodes
(``p40fleet.verification.collective``): bus bandwidth and latency per node and for the group,
FAIL under ``stack.ray.collective_min_busbw_gbs`` or when a member cannot join. The JSON
report carries its provenance (UTC time, inventory, p40fleet version), the pins in force and
each host's GPUs; ``--junit`` writes the same report as JUnit XML for CI systems.

Exit status (the DeepOps validators' contract):

* 0 — every host passed (SKIPs allowed);
* 1 — a host failed a check or could not be reached;
* 2 — usage or environment error: bad arguments, no such inventory file, pyinfra missing, or
  pyinfra stopped before the verification produced a report;
* 3 — every other host passed, but one or more are REFUSED: outside the stack (GPU, OS, stack
  spec or verl ref refused by the preflight; the table says why and the fix).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from p40fleet import paths, report
from p40fleet.verification import TABLE_ENV
from p40fleet.verification import collective as coll
from p40fleet.verification.smoke import CHECK as SMOKE_CHECK
from p40fleet.verification.smoke import CLUSTER_CHECK as SMOKE_CLUSTER_CHECK
from p40fleet.verification.smoke import (
    DEFAULT_TIMEOUT_S,
    MIN_TIMEOUT_S,
    SMOKE_DATA,
    SMOKE_TIMEOUT_DATA,
)

__all__ = ["DEPLOY", "REPO", "main", "pyinfra_command"]


def _checkout() -> Path:
    """The checkout whose ``deploy/verify.py`` runs: the working directory when it is one (a
    pyinfra deploy runs from its checkout; the p40fleet wheel holds no deploys), else the one
    this package sits in (an editable install)."""
    for root in (Path.cwd(), paths.REPO):
        if (root / "deploy" / "verify.py").is_file():
            return root
    return paths.REPO


REPO = _checkout()
DEPLOY = REPO / "deploy" / "verify.py"
#: Lines of pyinfra's output kept to explain an environment error.
_TAIL = 40


class UsageError(Exception):
    """Exit 2 with this message."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own: print usage, exit 2
        self.print_usage(sys.stderr)
        self.exit(report.EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m p40fleet.verify",
        description="Verify the P40 verl stack on every host of an inventory (changes nothing). "
        "Exit 0: all hosts pass; 1: a host fails or is unreachable; 2: usage/environment error; "
        "3: the hosts that do not pass are all refused (outside the stack).",
    )
    parser.add_argument(
        "inventory",
        metavar="INVENTORY",
        help="pyinfra inventory: a file (inventories/sim.py), @local, or host[,host...]",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the JSON report to PATH")
    parser.add_argument(
        "--junit",
        metavar="PATH",
        help="also write JUnit XML to PATH (a testsuite per host, a testcase per check)",
    )
    parser.add_argument(
        "--limit",
        metavar="HOST",
        action="append",
        default=[],
        help="verify only this host or group (repeatable; passed to pyinfra --limit)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="also run ONE PPO step through each passing host's ~/launch-ppo.sh, as the "
        "training user (CPU on a simulated host); minutes per host",
    )
    parser.add_argument(
        "--smoke-timeout",
        metavar="S",
        type=int,
        default=None,
        help=f"bound of one smoke step in seconds (default {DEFAULT_TIMEOUT_S}: a cold start)",
    )
    parser.add_argument(
        "--collective",
        action="store_true",
        help="also run, on the Ray head, one all-reduce over the cluster's training nodes "
        "(NCCL; gloo on simulated hosts): bus bandwidth, latency, FAIL under the floor",
    )
    parser.add_argument(
        "--collective-timeout",
        metavar="S",
        type=int,
        default=None,
        help=f"bound of the collective check in seconds (default {coll.DEFAULT_TIMEOUT_S})",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="one table row per check, PASS included"
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="hide pyinfra's output (shown on error)"
    )
    return parser


def _inventory_arg(value: str) -> str:
    """An existing inventory file as an absolute path, or a pyinfra host list as given."""
    if value.startswith("@") or "," in value:
        return value
    path = Path(value).expanduser()
    if path.is_file():
        return str(path.resolve())
    if path.exists():
        raise UsageError(f"inventory {value} is not a file")
    if value.endswith(".py") or os.sep in value:
        raise UsageError(f"inventory file {value} does not exist")
    return value  # a bare host name: pyinfra connects to it over SSH


def _json_arg(value: str | None, option: str = "--json") -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser().resolve()
    if path.is_dir():
        raise UsageError(f"{option} {value} is a directory, expected a file path")
    if not path.parent.is_dir():
        raise UsageError(f"{option} {value}: directory {path.parent} does not exist")
    return path


def pyinfra_command(
    inventory: str,
    limits: Sequence[str] = (),
    smoke: bool = False,
    smoke_timeout: int | None = None,
    collective: bool = False,
    collective_timeout: int | None = None,
) -> list[str]:
    """The pyinfra command line the CLI runs (``smoke``: host data ``verify_smoke=yes``;
    ``collective``: ``verify_collective=yes``)."""
    # config.py installs p40fleet.runtime.sshguard before pyinfra connects: a host whose key
    # would not be checked gets no connection at all (security S17).
    command = [sys.executable, "-m", "pyinfra", "-y", "--config", str(REPO / "config.py")]
    command += [inventory, str(DEPLOY)]
    if smoke:
        command += ["--data", f"{SMOKE_DATA}=yes"]
        if smoke_timeout is not None:
            command += ["--data", f"{SMOKE_TIMEOUT_DATA}={smoke_timeout}"]
    if collective:
        command += ["--data", f"{coll.COLLECTIVE_DATA}=yes"]
        if collective_timeout is not None:
            command += ["--data", f"{coll.COLLECTIVE_TIMEOUT_DATA}={collective_timeout}"]
    if not inventory.startswith("@") and not Path(inventory).is_file():
        # A host list carries no host data: pyinfra's default would trust the first key it
        # sees (accept-new). Strict checking holds for host lists too (security S17).
        command += ["--data", "ssh_strict_host_key_checking=yes"]
    for limit in limits:
        command += ["--limit", limit]
    return command


def _run_pyinfra(command: list[str], env: dict[str, str], quiet: bool) -> tuple[int, list[str]]:
    """Run pyinfra from the repo root, streaming its output (unless quiet); keep the tail."""
    tail: collections.deque[str] = collections.deque(maxlen=_TAIL)
    with subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        bufsize=1,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if not quiet:
                sys.stdout.write(line)
                sys.stdout.flush()
        rc = proc.wait()
    return rc, list(tail)


def _env(report_path: Path, inventory: str) -> dict[str, str]:
    env = dict(os.environ)
    env[report.REPORT_ENV] = str(report_path)
    env[report.INVENTORY_ENV] = inventory  # the report's provenance
    env[TABLE_ENV] = "0"  # this CLI prints the table itself
    paths = [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def _fail(message: str, code: int = report.EXIT_USAGE) -> int:
    print(f"p40fleet.verify: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        inventory = _inventory_arg(args.inventory)
        json_path = _json_arg(args.json)
        junit_path = _json_arg(args.junit, "--junit")
        if args.smoke_timeout is not None and not args.smoke:
            raise UsageError("--smoke-timeout needs --smoke")
        if args.smoke_timeout is not None and args.smoke_timeout < MIN_TIMEOUT_S:
            raise UsageError(
                f"--smoke-timeout {args.smoke_timeout}: expected seconds >= {MIN_TIMEOUT_S}"
            )
        if args.collective_timeout is not None and not args.collective:
            raise UsageError("--collective-timeout needs --collective")
        if args.collective_timeout is not None and args.collective_timeout < coll.MIN_TIMEOUT_S:
            raise UsageError(
                f"--collective-timeout {args.collective_timeout}: expected seconds >= "
                f"{coll.MIN_TIMEOUT_S}"
            )
    except UsageError as exc:
        return _fail(str(exc))
    if importlib.util.find_spec("pyinfra") is None:
        return _fail(f"pyinfra is not installed for {sys.executable} (pip install 'pyinfra>=3.10')")
    if not DEPLOY.is_file():
        return _fail(
            f"{DEPLOY} is missing: run this from the p40fleet checkout (deploy/, facts/, "
            "operations/ and files/ are used from there, not installed)"
        )

    with tempfile.TemporaryDirectory(prefix="p40fleet-verify-") as tmp:
        report_path = Path(tmp) / "report.json"
        command = pyinfra_command(
            inventory,
            args.limit,
            args.smoke,
            args.smoke_timeout,
            args.collective,
            args.collective_timeout,
        )
        try:
            rc, tail = _run_pyinfra(command, _env(report_path, inventory), args.quiet)
        except OSError as exc:
            return _fail(f"cannot run pyinfra: {exc}")
        if not report_path.is_file():
            return _no_report(rc, tail, args.quiet)
        try:
            fleet = report.load_report(report_path)
        except report.ReportError as exc:
            return _fail(str(exc))

    # the files first: a table that cannot be printed must not cost the report
    if json_path is not None:
        report.write_report(fleet, json_path)
    if junit_path is not None:
        report.write_junit(fleet, junit_path)
    report.print_report(fleet, verbose=args.verbose)
    if args.smoke:
        _print_smoke(fleet)
    if args.collective:
        _print_collective(fleet)
    if json_path is not None:
        print(f"report: {json_path}")
    if junit_path is not None:
        print(f"junit: {junit_path}")
    code = report.exit_code(fleet)
    verdicts = {entry["verdict"] for entry in fleet["hosts"].values()}
    if verdicts == {report.UNREACHABLE}:
        print("p40fleet.verify: no host could be reached: nothing was verified", file=sys.stderr)
    if code == report.EXIT_OK and rc != 0:
        print(
            f"p40fleet.verify: every host passed but pyinfra exited {rc}: see its output above",
            file=sys.stderr,
        )
        code = report.EXIT_FAIL
    return code


def _print_smoke(fleet: dict) -> None:
    """One line per host with a smoke step (the table shows a PASS only with -v), and the Ray
    head's ``smoke step (cluster)`` line."""
    for name, entry in sorted((fleet.get("hosts") or {}).items()):
        for check in entry.get("checks") or []:
            if check.get("name") in (SMOKE_CHECK, SMOKE_CLUSTER_CHECK):
                fix = f" (fix: {check['remedy']})" if check.get("remedy") else ""
                print(f"{check['name']} {name}: {check['status']} {check['detail']}{fix}")


def _print_collective(fleet: dict) -> None:
    """The collective check's lines (per node, then the group), from the head's entry."""
    printed = False
    for name, entry in sorted((fleet.get("hosts") or {}).items()):
        for check in entry.get("checks") or []:
            if check.get("name", "").split(" ")[0] == coll.CHECK:
                fix = f" (fix: {check['remedy']})" if check.get("remedy") else ""
                print(f"{check['name']} [{name}]: {check['status']} {check['detail']}{fix}")
                printed = True
    if not printed:
        print("collective: no host reported it (the Ray head was not verified)")


def _no_report(rc: int, tail: list[str], quiet: bool) -> int:
    """pyinfra ended without a report: no host reached (1), or it failed before verifying (2)."""
    text = "\n".join(tail)
    if quiet and tail:
        print(text, file=sys.stderr)
    if "No hosts remaining" in text and "Preparing operation" not in text:
        return _fail("no host could be reached: nothing was verified", report.EXIT_FAIL)
    return _fail(f"pyinfra exited {rc} before the verification wrote its report")
