"""The driver's checks: the installed module (modinfo), its DKMS build for the running
kernel, and nvidia-smi's GPUs and loaded driver."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from p40fleet.gpu_catalog import NVIDIA_VENDOR_ID, lookup, normalize_bus_id, parse_pci_id
from p40fleet.verification.check import (
    FAIL,
    PASS,
    SIMULATED,
    SKIP,
    Check,
    force_reinstall,
    no_answer,
)
from p40fleet.verification.checks._common import SYSTEM, first_line
from p40fleet.verification.probe import CheckContext, Section

_DRIVER_VERSION = re.compile(r"\b(\d{3}\.\d+(?:\.\d+)?)\b")


def driver_installed(ctx: CheckContext) -> Check:
    pinned = ctx.spec.driver.version
    section = ctx.answers.section("modinfo")
    remedy = f"{SYSTEM} (installs driver {pinned}); " + force_reinstall("driver", "re-run it")
    if section is None:
        return no_answer("driver installed", "modinfo -F version nvidia", remedy)
    found = next(
        (m.group(1) for line in section.raw if (m := _DRIVER_VERSION.fullmatch(line.strip()))),
        None,
    )
    if section.rc == 0 and found == pinned:
        return Check("driver installed", PASS, f"modinfo: nvidia {found}")
    if found:
        return Check(
            "driver installed",
            FAIL,
            f"modinfo: nvidia {found} installed, expected {pinned}",
            remedy,
        )
    why = first_line(section) or f"exit {section.rc}"
    return Check("driver installed", FAIL, f"no nvidia kernel module installed ({why})", remedy)


_DKMS_LINE = re.compile(
    r"^(?P<module>[^,/\s]+)(?:/|,\s*)(?P<version>[^,\s]+),\s*(?P<kernel>[^,\s]+),"
    r"\s*(?P<arch>[^:\s]+):\s*(?P<state>[A-Za-z-]+)"
)


def dkms(ctx: CheckContext) -> Check:
    pinned = ctx.spec.driver.version
    section = ctx.answers.section("dkms")
    host = ctx.answers.section("host")
    kernel = (host.get("kernel") if host else None) or "?"
    remedy = (
        f"install dkms and linux-headers-{kernel}, then {force_reinstall('driver', SYSTEM)} "
        "(the driver registers its DKMS module for the running kernel)"
    )
    if section is None:
        return no_answer("dkms", "dkms status", remedy)
    if section.get("missing") == "dkms":
        return Check("dkms", FAIL, "dkms is not installed", remedy)
    entries = [m.groupdict() for line in section.raw if (m := _DKMS_LINE.match(line.strip()))]
    nvidia = [e for e in entries if e["module"] == "nvidia"]
    for entry in nvidia:
        if (
            entry["version"] == pinned
            and entry["kernel"] == kernel
            and entry["state"] == "installed"
        ):
            return Check(
                "dkms",
                PASS,
                f"nvidia/{pinned}, {kernel}, {entry['arch']}: installed",
            )
    listed = "; ".join(f"nvidia/{e['version']}, {e['kernel']}: {e['state']}" for e in nvidia) or (
        first_line(section) or "nothing"
    )
    return Check(
        "dkms",
        FAIL,
        f"dkms status has no nvidia/{pinned} installed for the running kernel {kernel} "
        f"(lists: {listed})",
        remedy,
    )


@dataclass(frozen=True)
class _SmiRow:
    bus_id: str
    device_id: int | None
    name: str
    driver_version: str | None


def _smi_rows(section: Section) -> list[_SmiRow]:
    fields = (section.get("fields") or "").split(",")
    rows = []
    for line in section.raw:
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(fields) or not values[0].isdigit():
            continue
        row = dict(zip(fields, values, strict=True))
        parsed = parse_pci_id(row.get("pci.device_id", ""))
        device = parsed[1] if parsed and parsed[0] == NVIDIA_VENDOR_ID else None
        driver = row.get("driver_version")
        rows.append(
            _SmiRow(
                bus_id=normalize_bus_id(row.get("pci.bus_id", "")),
                device_id=device,
                name=row.get("name", ""),
                driver_version=driver if driver and "N/A" not in driver else None,
            )
        )
    return rows


def _smi_problem(section: Section | None, remedy: str, name: str) -> Check | None:
    """A FAIL when nvidia-smi is missing or did not answer, else None."""
    if section is None:
        return no_answer(name, "nvidia-smi", remedy)
    if section.get("missing"):
        return Check(name, FAIL, "nvidia-smi not found: no NVIDIA driver installed", remedy)
    if section.rc != 0:
        why = first_line(section) or "no output"
        return Check(name, FAIL, f"nvidia-smi failed (exit {section.rc}): {why}", remedy)
    return None


def _smi_remedy(pinned: str) -> str:
    return (
        f"the pinned driver {pinned} must be installed and loaded: {SYSTEM} with "
        "stack.policy.allow_reboot=True (or reboot after it); read /var/log/nvidia-installer.log"
    )


def _pci_label(gpu: Any) -> str:
    model = getattr(gpu, "model", None) or lookup(gpu.device_id)
    name = model.name if model else "unknown"
    return f"{gpu.bus_id} ({name} 10de:{gpu.device_id:04x})"


def smi_gpus(ctx: CheckContext) -> Check:
    name = "nvidia-smi gpus"
    if ctx.sim:
        return Check(name, SKIP, f"{SIMULATED}: nvidia-smi there is the lab's double")
    if not ctx.pci:
        return Check(name, SKIP, "no NVIDIA GPU in the PCI facts to compare with (see gpus)")
    section = ctx.answers.section("nvidia-smi")
    remedy = _smi_remedy(ctx.spec.driver.version)
    problem = _smi_problem(section, remedy, name)
    if problem is not None:
        return problem
    assert section is not None
    rows = {row.bus_id: row for row in _smi_rows(section)}
    missing, wrong = [], []
    for gpu in ctx.pci:
        row = rows.get(normalize_bus_id(gpu.bus_id))
        if row is None:
            missing.append(_pci_label(gpu))
        elif row.device_id is not None and row.device_id != gpu.device_id:
            wrong.append(f"{gpu.bus_id}: PCI 10de:{gpu.device_id:04x}, nvidia-smi {row.name}")
    pci_bus = {normalize_bus_id(g.bus_id) for g in ctx.pci}
    extra = sorted(bus for bus in rows if bus not in pci_bus)
    if missing or wrong:
        parts = []
        if missing:
            parts.append("not shown: " + ", ".join(missing))
        if wrong:
            parts.append("different device: " + "; ".join(wrong))
        return Check(
            name,
            FAIL,
            f"nvidia-smi shows {len(rows)} of the {len(ctx.pci)} GPUs on the PCI bus; "
            + "; ".join(parts),
            "a GPU the driver does not bind: check `dmesg | grep -i nvrm` (unsupported by the "
            f"driver branch, fallen off the bus, power); {remedy}",
        )
    note = f" (+{len(extra)} not in the PCI facts: {', '.join(extra)})" if extra else ""
    return Check(
        name,
        PASS,
        f"{len(ctx.pci)}/{len(ctx.pci)} GPUs: "
        + ", ".join(f"{g.bus_id} 10de:{g.device_id:04x}" for g in ctx.pci)
        + note,
    )


def smi_driver(ctx: CheckContext) -> Check:
    name = "nvidia-smi driver"
    pinned = ctx.spec.driver.version
    if ctx.sim:
        return Check(name, SKIP, f"{SIMULATED}: nvidia-smi there is the lab's double")
    section = ctx.answers.section("nvidia-smi")
    remedy = _smi_remedy(pinned)
    problem = _smi_problem(section, remedy, name)
    if problem is not None:
        return problem
    assert section is not None
    versions = sorted({row.driver_version or "?" for row in _smi_rows(section)})
    if not versions:
        why = first_line(section) or "no GPU rows"
        return Check(name, FAIL, f"nvidia-smi listed no GPU ({why})", remedy)
    if versions == [pinned]:
        return Check(name, PASS, f"driver {pinned} loaded")
    return Check(
        name,
        FAIL,
        f"nvidia-smi reports driver {', '.join(versions)}, expected {pinned}",
        f"{force_reinstall('driver', SYSTEM)}, then reboot so {pinned} is the loaded module",
    )
