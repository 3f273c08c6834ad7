"""The fleet verification report: JSON, a rich table, and the exit status.

JSON (written by ``deploy/verify.py`` to ``$P40FLEET_REPORT``, read by ``p40fleet.verify``)::

    {"format": 1,
     "provenance": {"generated_at": "2026-11-30T19:40:02Z", "inventory": "/…/lab.py",
                    "p40fleet_version": "0.1.0", "p40fleet_commit": "a45d7cd…",
                    "controller": "ctl"},
     "pins": {"driver": "525.147.05", "cuda": "11.8.0", …},      # the pins every host shares
     "hosts": {"lab1": {"verdict": "PASS", "checks": [
                  {"name": "torch version", "status": "PASS", "detail": "2.6.0+cu118 True (6, 1)",
                   "remedy": ""}, ...],
                  "gpus": {"count": 4, "models": ["4× Tesla P40"], "lowest_cc": "6.1", …},
                  "pins": {"driver": "525.147.05", …}},
               "lab9": {"verdict": "UNREACHABLE", "checks": [{"name": "connect", ...}]}},
     "summary": {"hosts": 2, "pass": 1, "fail": 0, "unreachable": 1, "verdict": "FAIL",
                 "checks": {"PASS": 17, "FAIL": 1, "SKIP": 3}}}

``provenance``, ``pins`` and a host's ``gpus``/``pins`` tell two reports apart; a report
without them (older, or a host never reached) is still valid. :func:`junit_xml` writes the
same report as JUnit XML for CI systems (one ``testsuite`` per host, one ``testcase`` per check).

Host verdicts: ``PASS`` (no check failed; SKIPs allowed), ``FAIL``, ``UNREACHABLE`` (pyinfra
could not connect), ``REFUSED`` (a host outside the stack: its GPUs, OS, stack spec or verl ref
are refused by the preflight; one check per reason, with the fix, and nothing else is probed).
The fleet passes only when every host passes: exit status 0; 1 when a host failed or was
unreachable; 3 when the only hosts that did not pass were refused (the DeepOps validators'
contract, plus 3; 2 is the CLI's usage/environment error).

Every table cell built from host output is a rich ``Text`` (never parsed as markup).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from p40fleet.host_key import HOST_KEY_REMEDY, HOST_KEY_STEP
from p40fleet.host_key import REFUSED as GUARD_REFUSED
from p40fleet.paths import REPO
from p40fleet.spec import StackSpec
from p40fleet.verification.check import FAIL, PASS, SKIP, Check, host_verdict

__all__ = [
    "EXIT_FAIL",
    "EXIT_OK",
    "EXIT_USAGE",
    "INVENTORY_ENV",
    "EXIT_REFUSED",
    "REFUSED",
    "REPORT_ENV",
    "UNREACHABLE",
    "ReportError",
    "build_report",
    "connect_entry",
    "exit_code",
    "fleet_table",
    "gpu_summary",
    "host_entry",
    "inventory_from_argv",
    "junit_xml",
    "load_report",
    "print_report",
    "provenance",
    "refused_entry",
    "spec_pins",
    "unreachable_entry",
    "write_junit",
    "write_report",
]

#: Environment variable naming the JSON report file deploy/verify.py writes.
REPORT_ENV = "P40FLEET_REPORT"
#: Environment variable naming the inventory for the report (set by ``p40fleet.verify``).
INVENTORY_ENV = "P40FLEET_INVENTORY"
UNREACHABLE = "UNREACHABLE"
REFUSED = "REFUSED"
VERDICTS = (PASS, FAIL, UNREACHABLE, REFUSED)
REPORT_FORMAT = 1

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3

_STYLE = {
    PASS: "green",
    FAIL: "bold red",
    SKIP: "yellow",
    UNREACHABLE: "bold magenta",
    REFUSED: "bold yellow",
}


class ReportError(ValueError):
    """A report file that is missing, not JSON, or not in this format."""


def host_entry(
    checks: Iterable[Check],
    *,
    gpus: Mapping[str, Any] | None = None,
    pins: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``{"verdict": PASS|FAIL, "checks": [...]}`` for one verified host (+ gpus, pins)."""
    checks = list(checks)
    entry: dict[str, Any] = {
        "verdict": host_verdict(checks),
        "checks": [c.to_dict() for c in checks],
    }
    if gpus is not None:
        entry["gpus"] = dict(gpus)
    if pins is not None:
        entry["pins"] = dict(pins)
    return entry


def spec_pins(spec: StackSpec) -> dict[str, str]:
    """The versions a host's stack spec pins (artifacts with their sha256, refs with commits)."""
    pins: dict[str, str] = {}
    for name in ("driver", "cuda", "cudnn", "miniconda"):
        artifact = getattr(spec, name)
        pins[name] = artifact.version
        pins[f"{name}.sha256"] = artifact.sha256
    pins["python"] = spec.python_version
    pins["torch"] = spec.torch.version
    for extra in ("torchvision", "torchaudio"):
        if (version := getattr(spec.torch, extra)) is not None:
            pins[extra] = version
    pins["torch.index_url"] = str(spec.torch.index_url)
    for name in ("apex", "verl"):
        pin = getattr(spec, name)
        pins[name] = pin.ref
        pins[f"{name}.commit"] = pin.commit
    pins["conda_tos"] = spec.policy.conda_tos
    return pins


def gpu_summary(gpus: Sequence[Any], spec: StackSpec) -> dict[str, Any]:
    """One host's GPUs for the report: models, capability, profile, the stack's verdict.

    ``gpus`` are the PCI facts (``PciGpu``: an id the catalog lacks keeps the model derived
    from the host's pci.ids name) or device ids.
    """
    summary = spec.gpu_summary(gpus)
    return {
        "count": summary.gpu_count,
        "models": list(summary.models),
        "device_ids": [f"10de:{i:04x}" for i in summary.device_ids],
        "lowest_cc": summary.capability_str if summary.lowest_capability else None,
        "profile": summary.profile,
        "driver_branch": summary.driver_branch,
        "verdict": summary.verdict,
    }


# pyinfra's options that take a value (pyinfra 3 CLI): skipped when looking for the inventory
_PYINFRA_VALUE_OPTIONS = frozenset(
    "--limit --data --group-data --config --chdir --user --port --key --key-password "
    "--password --sudo-user --su-user --shell-executable --parallel --fail-percent --retry "
    "--retry-delay --debug-facts --debug-operations".split()
)


def inventory_from_argv(argv: Sequence[str]) -> str | None:
    """The inventory argument of a ``pyinfra [options] INVENTORY OPERATIONS...`` command line."""
    skip = False
    for arg in argv[1:]:
        if skip:
            skip = False
            continue
        if arg.startswith("-"):
            skip = arg in _PYINFRA_VALUE_OPTIONS
            continue
        path = Path(arg)
        return str(path.resolve()) if path.is_file() else arg
    return None


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True, text=True, timeout=5, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _version() -> str:
    try:
        return metadata.version("p40fleet")
    except metadata.PackageNotFoundError:
        return "unknown"


def provenance(inventory: str | None = None, *, now: datetime | None = None) -> dict[str, Any]:
    """Where and when a report was made: UTC time, inventory, p40fleet version and commit.

    ``inventory`` defaults to ``$P40FLEET_INVENTORY``, else pyinfra's command line.
    """
    if inventory is None:
        inventory = os.environ.get(INVENTORY_ENV) or inventory_from_argv(sys.argv)
    moment = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return {
        "generated_at": moment.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "inventory": inventory,
        "p40fleet_version": _version(),
        "p40fleet_commit": _commit(),
        "controller": socket.gethostname(),
    }


_UNREACHABLE_FIX = (
    "check the host is up and reachable (ssh, inventory address/user/keys), then re-run"
)


def unreachable_entry(reason: str = "pyinfra could not connect to this host") -> dict[str, Any]:
    """The entry of a host that was never verified."""
    check = Check("connect", FAIL, reason, _UNREACHABLE_FIX)
    return {"verdict": UNREACHABLE, "checks": [check.to_dict()]}


#: pyinfra's words for a host whose key is not the recorded one / has none recorded.
_KEY_CHANGED = "SSH host key error"
_KEY_UNKNOWN = "No host key for"


def connect_entry(name: str, kind: str | None = None, error: str | None = None) -> dict[str, Any]:
    """The entry of host ``name`` that could not be reached, from why (``sshguard``'s record).

    ``kind`` ``"refused"``: sshguard refused it (its key would not be checked): REFUSED, as
    ``deploy/verify.py`` and the preflight say. A key that changed (a reinstall, or someone
    else at that address) or that known_hosts lacks: UNREACHABLE with its own check, whose fix
    is ``python -m p40fleet.rekey``. Else UNREACHABLE with pyinfra's own error.
    """
    if kind is None or error is None:
        return unreachable_entry()
    if kind == GUARD_REFUSED:
        return refused_entry(
            [(HOST_KEY_STEP, error.removeprefix(f"host {name}: "), HOST_KEY_REMEDY)]
        )
    rekey = (
        f"python -m p40fleet.rekey INVENTORY {name} --expect SHA256:... (the fingerprint from "
        "the host's console: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub) records it, then "
        "re-run"
    )
    if _KEY_CHANGED in error:
        check = Check(
            HOST_KEY_STEP,
            FAIL,
            f"{error}: the host presents another key than the one known_hosts records for it "
            "(reinstalled, or someone else answers at that address); nothing was sent",
            f"if it was reinstalled: {rekey}",
        )
    elif _KEY_UNKNOWN in error:
        check = Check(
            HOST_KEY_STEP,
            FAIL,
            f"{error}: known_hosts has no key for it; nothing was sent",
            rekey,
        )
    else:
        check = Check("connect", FAIL, f"pyinfra could not connect: {error}", _UNREACHABLE_FIX)
    return {"verdict": UNREACHABLE, "checks": [check.to_dict()]}


def refused_entry(refusals: Iterable[tuple[str, str, str]]) -> dict[str, Any]:
    """The entry of a host outside the stack: ``(step, reason, fix)`` per preflight refusal."""
    checks = [Check(step, FAIL, reason, remedy) for step, reason, remedy in refusals]
    return {"verdict": REFUSED, "checks": [c.to_dict() for c in checks]}


def _summary(hosts: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    verdicts = Counter(entry["verdict"] for entry in hosts.values())
    statuses = Counter(c["status"] for entry in hosts.values() for c in entry["checks"])
    ok = bool(hosts) and all(entry["verdict"] == PASS for entry in hosts.values())
    return {
        "hosts": len(hosts),
        "pass": verdicts.get(PASS, 0),
        "fail": verdicts.get(FAIL, 0),
        "unreachable": verdicts.get(UNREACHABLE, 0),
        "refused": verdicts.get(REFUSED, 0),
        "verdict": PASS if ok else FAIL,
        "checks": {status: statuses.get(status, 0) for status in (PASS, FAIL, SKIP)},
    }


def _common_pins(hosts: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """The pins every host that has them agrees on (a pin set per host overrides it)."""
    sets = [entry["pins"] for entry in hosts.values() if isinstance(entry.get("pins"), dict)]
    if not sets:
        return {}
    return {k: v for k, v in sets[0].items() if all(other.get(k) == v for other in sets[1:])}


def build_report(
    hosts: Mapping[str, Mapping[str, Any]], *, provenance: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The report dict from ``{host name: host_entry(...) | unreachable_entry()}``."""
    ordered = {name: dict(hosts[name]) for name in sorted(hosts)}
    data: dict[str, Any] = {"format": REPORT_FORMAT}
    if provenance is not None:
        data["provenance"] = dict(provenance)
        data["pins"] = _common_pins(ordered)
    data["hosts"] = ordered
    data["summary"] = _summary(ordered)
    return data


def _write_atomically(path: str | os.PathLike[str], text: str, prefix: str) -> None:
    """Write ``text`` to ``path``: a temp file in the same directory, then a rename."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_report(report: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write the report as JSON (atomically: a temp file in the same dir, then rename)."""
    text = json.dumps(report, indent=2, sort_keys=False) + "\n"
    _write_atomically(path, text, ".p40fleet-report-")


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
    """0 when every host passed; 3 when the others were all refused (outside the stack);
    else 1 (a failed or unreachable host, or no host at all)."""
    verdicts = {entry.get("verdict") for entry in (report.get("hosts") or {}).values()}
    if verdicts == {PASS}:
        return EXIT_OK
    if verdicts and verdicts <= {PASS, REFUSED}:
        return EXIT_REFUSED
    return EXIT_FAIL


def _styled(status: str) -> Text:
    return Text(str(status), style=_STYLE.get(status, ""))


def _problems(checks: list[Mapping[str, Any]], show_skips: bool, refused: bool = False) -> Text:
    text = Text()
    if refused:
        text.append("outside this stack (nothing else was checked): ", style=_STYLE[REFUSED])
    for check in checks:
        status = check["status"]
        if status == PASS or (status == SKIP and not show_skips):
            continue
        if text:
            text.append("\n")
        if not refused:
            text.append(f"{status} ", style=_STYLE[status])
        text.append(f"{check['name']}: ", style="bold")
        text.append(str(check["detail"]))
        if status == FAIL and check.get("remedy"):
            text.append(" — fix: ", style="bold")
            text.append(str(check["remedy"]))
    return text or Text("all checks pass", style="green")


def fleet_table(report: Mapping[str, Any], *, verbose: bool = False) -> Table:
    """One row per host (verdict, counts, FAIL/SKIP details); ``verbose``: one row per check."""
    summary = report.get("summary") or _summary(report.get("hosts", {}))
    title = (
        f"p40fleet verify: {summary['pass']}/{summary['hosts']} hosts pass"
        + (f", {summary['fail']} fail" if summary["fail"] else "")
        + (f", {summary['unreachable']} unreachable" if summary["unreachable"] else "")
        + (f", {summary['refused']} refused" if summary.get("refused") else "")
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
                refused = hosts[name]["verdict"] == REFUSED
                # Text(), never str: host output such as "[/usr/local/cuda/lib64]" is no markup
                table.add_row(
                    label,
                    Text(str(check["name"])),
                    _styled(REFUSED if refused else check["status"]),
                    Text(str(check["detail"])),
                    Text(str(check.get("remedy", "")) if check["status"] == FAIL else ""),
                )
        return table
    table.add_column("host", overflow="fold", no_wrap=False)
    table.add_column("verdict")
    table.add_column("pass/fail/skip", justify="center")
    table.add_column("failures (fix) and skips", overflow="fold")
    for name in sorted(hosts):
        entry = hosts[name]
        counts = Counter(c["status"] for c in entry["checks"])
        refused = entry["verdict"] == REFUSED
        table.add_row(
            Text(name),
            _styled(entry["verdict"]),
            "-"
            if refused
            else f"{counts.get(PASS, 0)}/{counts.get(FAIL, 0)}/{counts.get(SKIP, 0)}",
            _problems(entry["checks"], show_skips=True, refused=refused),
        )
    return table


def console(*, stderr: bool = False) -> Console:
    """A rich console as wide as the terminal (rich's width: the terminal's, else
    ``$COLUMNS``); written to a pipe or a log without ``$COLUMNS``, 200 columns (there is no
    width to fit, and long lines stay whole for grep)."""
    out = Console(stderr=stderr)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(stderr=stderr, width=200)
    return out


def pyinfra_json() -> bool:
    """True inside ``pyinfra --json …``: its stdout is JSON only, the human lines and tables go
    to stderr (:func:`human_console`, :func:`human_stream`)."""
    program = Path(sys.argv[0]) if sys.argv else Path()
    ran = program.name == "pyinfra" or program.parts[-2:] == ("pyinfra", "__main__.py")
    return ran and "--json" in sys.argv[1:]


def human_stream():
    """Where a deploy's human lines go: stdout, or stderr under ``pyinfra --json``."""
    return sys.stderr if pyinfra_json() else sys.stdout


def human_console() -> Console:
    """:func:`console` on :func:`human_stream`."""
    return console(stderr=pyinfra_json())


def print_report(
    report: Mapping[str, Any], *, verbose: bool = False, console: Console | None = None
) -> None:
    """Print :func:`fleet_table` (on :func:`human_console` unless a console is given)."""
    (console or human_console()).print(fleet_table(report, verbose=verbose))


# ---------------------------------------------------------------------------- JUnit XML


# characters XML 1.0 cannot carry (a host's output may hold terminal escapes)
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _x(value: object) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def _gpus_text(entry: Mapping[str, Any]) -> str | None:
    gpus = entry.get("gpus")
    if not isinstance(gpus, dict):
        return None
    models = ", ".join(gpus.get("models") or []) or "none"
    return f"{models} (cc {gpus.get('lowest_cc') or '-'}, profile {gpus.get('profile') or '-'})"


def junit_xml(report: Mapping[str, Any]) -> str:
    """The report as JUnit XML: a ``testsuite`` per host, a ``testcase`` per check.

    FAIL -> ``<failure message=detail>`` (the fix in its text), SKIP -> ``<skipped>``; an
    unreachable host is a suite with its failed ``connect`` case. Provenance, pins and the
    host's GPUs become ``<properties>``.
    """
    hosts = report.get("hosts") or {}
    prov = report.get("provenance") or {}
    root = ET.Element("testsuites", name="p40fleet verify")
    totals = Counter()
    for name in sorted(hosts):
        entry = hosts[name]
        checks = entry.get("checks") or []
        counts = Counter(c["status"] for c in checks)
        totals.update({"tests": len(checks), "failures": counts[FAIL], "skipped": counts[SKIP]})
        suite = ET.SubElement(
            root,
            "testsuite",
            name=_x(name),
            hostname=_x(name),
            tests=str(len(checks)),
            failures=str(counts[FAIL]),
            errors="0",
            skipped=str(counts[SKIP]),
            time="0",
        )
        if prov.get("generated_at"):
            suite.set("timestamp", prov["generated_at"].removesuffix("Z"))
        properties = ET.SubElement(suite, "properties")
        props = [("verdict", entry.get("verdict", ""))]
        if (gpus := _gpus_text(entry)) is not None:
            props.append(("gpus", gpus))
        props += [(f"provenance.{k}", v) for k, v in prov.items() if v is not None]
        props += [(f"pin.{k}", v) for k, v in (entry.get("pins") or {}).items()]
        for key, value in props:
            ET.SubElement(properties, "property", name=_x(key), value=_x(value))
        for check in checks:
            case = ET.SubElement(
                suite, "testcase", classname=_x(f"p40fleet.verify.{name}"), name=_x(check["name"])
            )
            case.set("time", "0")
            detail = _x(check.get("detail", ""))
            if check["status"] == FAIL:
                kind = REFUSED if entry.get("verdict") == REFUSED else FAIL
                failure = ET.SubElement(case, "failure", message=detail, type=kind)
                remedy = _x(check.get("remedy") or "")
                failure.text = f"{detail}\nfix: {remedy}" if remedy else detail
            elif check["status"] == SKIP:
                ET.SubElement(case, "skipped", message=detail)
            else:
                ET.SubElement(case, "system-out").text = detail
    for key in ("tests", "failures", "skipped"):
        root.set(key, str(totals[key]))
    root.set("errors", "0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(report: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write :func:`junit_xml` to ``path`` (atomically, like :func:`write_report`)."""
    _write_atomically(path, junit_xml(report), ".p40fleet-junit-")
