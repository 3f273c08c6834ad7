"""The fleet verification report: JSON, a rich table, and the exit status.

JSON (written by ``deploy/verify.py`` to ``$P40FLEET_REPORT``, read by ``p40fleet.verify``)::

    {"format": 1,
     "hosts": {"lab1": {"verdict": "PASS", "checks": [
                  {"name": "torch version", "status": "PASS", "detail": "2.6.0+cu118 True (6, 1)",
                   "remedy": ""}, ...]},
               "lab9": {"verdict": "UNREACHABLE", "checks": [{"name": "connect", ...}]}},
     "summary": {"hosts": 2, "pass": 1, "fail": 0, "unreachable": 1, "verdict": "FAIL",
                 "checks": {"PASS": 17, "FAIL": 1, "SKIP": 3}}}

Host verdicts: ``PASS`` (no check failed; SKIPs allowed), ``FAIL``, ``UNREACHABLE`` (pyinfra
could not connect). The fleet passes only when every host passes: exit status 0, else 1
(the DeepOps validators' contract; 2 is the CLI's usage/environment error).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from p40fleet.checks import FAIL, PASS, SKIP, Check, host_verdict

__all__ = [
    "EXIT_FAIL",
    "EXIT_OK",
    "EXIT_USAGE",
    "REPORT_ENV",
    "UNREACHABLE",
    "ReportError",
    "build_report",
    "exit_code",
    "fleet_table",
    "host_entry",
    "load_report",
    "print_report",
    "unreachable_entry",
    "write_report",
]

#: Environment variable naming the JSON report file deploy/verify.py writes.
REPORT_ENV = "P40FLEET_REPORT"
UNREACHABLE = "UNREACHABLE"
VERDICTS = (PASS, FAIL, UNREACHABLE)
REPORT_FORMAT = 1

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

_STYLE = {PASS: "green", FAIL: "bold red", SKIP: "yellow", UNREACHABLE: "bold magenta"}


class ReportError(ValueError):
    """A report file that is missing, not JSON, or not in this format."""


def host_entry(checks: Iterable[Check]) -> dict[str, Any]:
    """``{"verdict": PASS|FAIL, "checks": [...]}`` for one verified host."""
    checks = list(checks)
    return {"verdict": host_verdict(checks), "checks": [c.to_dict() for c in checks]}


def unreachable_entry(reason: str = "pyinfra could not connect to this host") -> dict[str, Any]:
    """The entry of a host that was never verified."""
    check = Check(
        "connect",
        FAIL,
        reason,
        "check the host is up and reachable (ssh, inventory address/user/keys), then re-run",
    )
    return {"verdict": UNREACHABLE, "checks": [check.to_dict()]}


def _summary(hosts: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    verdicts = Counter(entry["verdict"] for entry in hosts.values())
    statuses = Counter(c["status"] for entry in hosts.values() for c in entry["checks"])
    ok = bool(hosts) and all(entry["verdict"] == PASS for entry in hosts.values())
    return {
        "hosts": len(hosts),
        "pass": verdicts.get(PASS, 0),
        "fail": verdicts.get(FAIL, 0),
        "unreachable": verdicts.get(UNREACHABLE, 0),
        "verdict": PASS if ok else FAIL,
        "checks": {status: statuses.get(status, 0) for status in (PASS, FAIL, SKIP)},
    }


def build_report(hosts: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The report dict from ``{host name: host_entry(...) | unreachable_entry()}``."""
    ordered = {name: dict(hosts[name]) for name in sorted(hosts)}
    return {"format": REPORT_FORMAT, "hosts": ordered, "summary": _summary(ordered)}


def write_report(report: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write the report as JSON (atomically: a temp file in the same dir, then rename)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".p40fleet-report-", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(report, handle, indent=2, sort_keys=False)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a report file; raises :class:`ReportError`."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except OSError as exc:
        raise ReportError(f"cannot read report {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ReportError(f"report {path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("hosts"), dict):
        raise ReportError(f"report {path} has no 'hosts' object")
    for name, entry in data["hosts"].items():
        if (
            not isinstance(entry, dict)
            or entry.get("verdict") not in VERDICTS
            or not isinstance(entry.get("checks"), list)
        ):
            raise ReportError(f"report {path}: host {name!r} has no valid verdict/checks")
        try:
            for check in entry["checks"]:
                Check.from_dict(check)
        except (KeyError, TypeError, ValueError) as exc:
            raise ReportError(f"report {path}: host {name!r} has a bad check: {exc}") from None
    data["summary"] = _summary(data["hosts"])
    return data


def exit_code(report: Mapping[str, Any]) -> int:
    """0 when every host passed, else 1 (a failed or unreachable host, or no host at all)."""
    hosts = report.get("hosts") or {}
    if hosts and all(entry.get("verdict") == PASS for entry in hosts.values()):
        return EXIT_OK
    return EXIT_FAIL


def _styled(status: str) -> Text:
    return Text(status, style=_STYLE.get(status, ""))


def _problems(checks: list[Mapping[str, Any]], show_skips: bool) -> Text:
    text = Text()
    for check in checks:
        status = check["status"]
        if status == PASS or (status == SKIP and not show_skips):
            continue
        if text:
            text.append("\n")
        text.append(f"{status} ", style=_STYLE[status])
        text.append(f"{check['name']}: ", style="bold")
        text.append(check["detail"])
        if status == FAIL and check.get("remedy"):
            text.append(" — fix: ", style="bold")
            text.append(check["remedy"])
    return text or Text("all checks pass", style="green")


def fleet_table(report: Mapping[str, Any], *, verbose: bool = False) -> Table:
    """One row per host (verdict, counts, FAIL/SKIP details); ``verbose``: one row per check."""
    summary = report.get("summary") or _summary(report.get("hosts", {}))
    title = (
        f"p40fleet verify: {summary['pass']}/{summary['hosts']} hosts pass"
        + (f", {summary['fail']} fail" if summary["fail"] else "")
        + (f", {summary['unreachable']} unreachable" if summary["unreachable"] else "")
    )
    table = Table(title=title, show_lines=True)
    hosts = report.get("hosts", {})
    if verbose:
        for column in ("host", "check", "status", "detail", "fix"):
            table.add_column(column, overflow="fold")
        for name in sorted(hosts):
            for index, check in enumerate(hosts[name]["checks"]):
                label = Text(name, style="bold") if index == 0 else Text("")
                if index == 0:
                    label.append(" ")
                    label.append_text(_styled(hosts[name]["verdict"]))
                table.add_row(
                    label,
                    check["name"],
                    _styled(check["status"]),
                    check["detail"],
                    check.get("remedy", "") if check["status"] == FAIL else "",
                )
        return table
    table.add_column("host", overflow="fold", no_wrap=False)
    table.add_column("verdict")
    table.add_column("pass/fail/skip", justify="center")
    table.add_column("failures (fix) and skips", overflow="fold")
    for name in sorted(hosts):
        entry = hosts[name]
        counts = Counter(c["status"] for c in entry["checks"])
        table.add_row(
            name,
            _styled(entry["verdict"]),
            f"{counts.get(PASS, 0)}/{counts.get(FAIL, 0)}/{counts.get(SKIP, 0)}",
            _problems(entry["checks"], show_skips=True),
        )
    return table


def print_report(
    report: Mapping[str, Any], *, verbose: bool = False, console: Console | None = None
) -> None:
    """Print :func:`fleet_table` (width 200 unless a console is given)."""
    (console or Console(width=200)).print(fleet_table(report, verbose=verbose))
