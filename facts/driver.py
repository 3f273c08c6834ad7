"""NVIDIA driver facts: nvidia-smi, the installed kernel module and the loaded one.

Every command here exits 0 on any host (no GPU, no driver) and encodes what it saw in its
output, so gathering facts never fails a host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyinfra.api import FactBase
from typing_extensions import override

from p40fleet.gpu_catalog import (
    NVIDIA_VENDOR_ID,
    GpuModel,
    lookup,
    normalize_bus_id,
    parse_pci_id,
)
from p40fleet.jsonable import ToJson

SMI_MARKER = "##p40fleet-nvidia-smi"
SMI_FIELDS = "index,name,pci.bus_id,pci.device_id,compute_cap,memory.total,driver_version"
SMI_FIELDS_R470 = "index,name,pci.bus_id,pci.device_id,memory.total,driver_version"

SMI_OK = "ok"
SMI_ABSENT = "absent"
SMI_NOT_LOADED = "not-loaded"
SMI_MISMATCH = "mismatch"
SMI_NO_DEVICES = "no-devices"


@dataclass(frozen=True)
class SmiGpu(ToJson):
    """One GPU row of ``nvidia-smi --query-gpu``."""

    index: int
    name: str
    bus_id: str
    pci_id: int | None
    compute_capability: tuple[int, int] | None
    memory_mib: int | None
    driver_version: str | None

    @property
    def model(self) -> GpuModel | None:
        return lookup(self.pci_id) if self.pci_id is not None else None


@dataclass(frozen=True)
class SmiResult(ToJson):
    """nvidia-smi's state (``ok``/``absent``/``not-loaded``/``mismatch``/``no-devices``)."""

    state: str
    gpus: tuple[SmiGpu, ...] = ()
    message: str | None = None
    exit_code: int | None = None

    @property
    def ok(self) -> bool:
        return self.state == SMI_OK

    @property
    def driver_version(self) -> str | None:
        return next((g.driver_version for g in self.gpus if g.driver_version), None)


def _smi_query(fields: str) -> str:
    return f"nvidia-smi --query-gpu={fields} --format=csv,noheader,nounits 2>&1"


class NvidiaSmi(FactBase[SmiResult]):
    """
    Returns an ``SmiResult`` from ``nvidia-smi --query-gpu`` (never fails the host).

    No binary -> ``absent``; driver not loaded -> ``not-loaded``; NVML/driver
    mismatch -> ``mismatch``. On R470 (no ``compute_cap`` field, exit 2) it
    queries again without it and takes the capability from the catalog.
    """

    @staticmethod
    @override
    def default() -> SmiResult:
        return SmiResult(state=SMI_ABSENT)

    @override
    def command(self) -> str:
        m = SMI_MARKER
        return (
            "if ! command -v nvidia-smi >/dev/null 2>&1; then "
            f"echo '{m} absent'; "
            "else "
            f"f={SMI_FIELDS}; out=$({_smi_query('$f')}); rc=$?; "
            'if [ "$rc" -ne 0 ]; then case "$out" in *compute_cap*) '
            f"f={SMI_FIELDS_R470}; out=$({_smi_query('$f')}); rc=$?;; esac; fi; "
            f'echo "{m} rc=$rc fields=$f"; printf "%s\\n" "$out"; '
            "fi; true"
        )

    @override
    def process(self, output: list[str]) -> SmiResult:
        lines = list(output)
        header = next((i for i, line in enumerate(lines) if line.startswith(SMI_MARKER)), None)
        if header is None:
            return SmiResult(state=SMI_ABSENT, message="no nvidia-smi marker in output")
        words = dict(w.split("=", 1) for w in lines[header].split()[1:] if "=" in w)
        if "rc" not in words:
            return SmiResult(state=SMI_ABSENT)
        rc = int(words["rc"]) if words["rc"].lstrip("-").isdigit() else -1
        body = [line for line in lines[header + 1 :] if line.strip()]
        message = "\n".join(body)
        if rc != 0:
            if "version mismatch" in message:
                state = SMI_MISMATCH
            elif "No devices were found" in message:
                state = SMI_NO_DEVICES
            else:
                state = SMI_NOT_LOADED
            return SmiResult(state=state, message=message or None, exit_code=rc)
        fields = words.get("fields", SMI_FIELDS).split(",")
        gpus = tuple(g for g in (_smi_row(fields, line) for line in body) if g is not None)
        return SmiResult(state=SMI_OK, gpus=gpus, exit_code=0)


def _na(value: str | None) -> str | None:
    if value is None or value in ("", "[N/A]", "N/A", "[Not Supported]"):
        return None
    return value


def _smi_row(fields: list[str], line: str) -> SmiGpu | None:
    values = [v.strip() for v in line.split(",")]
    if len(values) != len(fields) or not values[0].isdigit():
        return None
    row = dict(zip(fields, values, strict=True))
    parsed = parse_pci_id(row.get("pci.device_id", ""))
    pci_id = parsed[1] if parsed and parsed[0] == NVIDIA_VENDOR_ID else None

    capability: tuple[int, int] | None = None
    cap = _na(row.get("compute_cap"))
    if cap and re.fullmatch(r"\d+\.\d+", cap):
        major, minor = cap.split(".")
        capability = (int(major), int(minor))
    elif pci_id is not None and (model := lookup(pci_id)) is not None:
        capability = model.compute_capability

    memory = _na(row.get("memory.total"))
    memory_mib = int(memory.split()[0]) if memory and memory.split()[0].isdigit() else None
    return SmiGpu(
        index=int(row["index"]),
        name=row.get("name", ""),
        bus_id=normalize_bus_id(row.get("pci.bus_id", "")),
        pci_id=pci_id,
        compute_capability=capability,
        memory_mib=memory_mib,
        driver_version=_na(row.get("driver_version")),
    )


_VERSION = re.compile(r"\b(\d{3}\.\d+(?:\.\d+)?)\b")


class InstalledDriverVersion(FactBase[str | None]):
    """
    Returns the installed NVIDIA kernel module version (``modinfo``), or ``None``.

    Works before the module is loaded (i.e. before the post-install reboot).
    """

    @override
    def command(self) -> str:
        return "PATH=$PATH:/sbin:/usr/sbin modinfo -F version nvidia 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> str | None:
        for line in output:
            match = _VERSION.search(line)
            if match:
                return match.group(1)
        return None


class LoadedDriverVersion(FactBase[str | None]):
    """Returns the version of the loaded ``nvidia`` module, or ``None`` when not loaded."""

    @override
    def command(self) -> str:
        return (
            "if [ -r /sys/module/nvidia/version ]; then cat /sys/module/nvidia/version; "
            "elif [ -r /proc/driver/nvidia/version ]; then cat /proc/driver/nvidia/version; "
            "fi; true"
        )

    @override
    def process(self, output: list[str]) -> str | None:
        return InstalledDriverVersion().process(output)
