"""GPU facts: PCI functions from sysfs, nvidia-smi, the installed driver, nouveau.

Every command here exits 0 on any host (no GPU, no driver, no sysfs) and
encodes what it saw in its output, so gathering facts never fails a host.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase
from typing_extensions import override

from p40fleet.gpu_catalog import (
    NVIDIA_VENDOR_ID,
    GpuModel,
    lookup,
    normalize_bus_id,
    parse_pci_id,
    resolve,
)


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


@dataclass(frozen=True)
class PciGpu:
    """One NVIDIA display/3D PCI function as sysfs shows it."""

    bus_id: str
    vendor_id: int
    device_id: int
    pci_class: int
    subsystem_vendor: int | None
    subsystem_device: int | None
    model: GpuModel | None
    #: The host's pci.ids name (``GP102 [GeForce GTX 1080 Ti]``), ``None`` without one.
    pci_name: str | None = None

    @property
    def identity(self) -> str:
        """How the model was recognised, for facts and refusals."""
        label = f"10de:{self.device_id:04x}"
        if self.model is None:
            named = f"pci.ids name {self.pci_name!r}" if self.pci_name else "no pci.ids name"
            return f"unknown {label} ({named}; not in p40fleet/gpu_catalog.py)"
        if self.model.derived_from:
            return f"{self.model.name} {label} ({self.model.derived_from})"
        return f"{self.model.name} {label}"

    @property
    def subsystem(self) -> str | None:
        """``10de:11d9`` (``?:11d9`` when the vendor half is unknown)."""
        if self.subsystem_device is None:
            return None
        vendor = "?" if self.subsystem_vendor is None else f"{self.subsystem_vendor:04x}"
        return f"{vendor}:{self.subsystem_device:04x}"


SYSFS_PCI_DEVICES = "/sys/bus/pci/devices"
_SYSFS_FIELDS = ("vendor", "device", "class", "subsystem_device", "subsystem_vendor")
#: Where distributions keep pci.ids (Debian/Ubuntu ``pci.ids``, RHEL/SUSE ``hwdata``).
PCI_IDS_FILES = "/usr/share/misc/pci.ids /usr/share/hwdata/pci.ids /usr/share/pci.ids"
PCI_NAME_MARKER = "##p40fleet-pci-name"

# Prints "MARKER <device> <name>" for the NVIDIA (10de) device lines of pci.ids whose id is in
# $ids; stops at the next vendor, so another vendor's device with the same number never matches.
# Plain POSIX awk (mawk, busybox): no interval expressions.
_PCI_NAME_AWK = (
    'BEGIN { n = split(ids, a, " "); for (i = 1; i <= n; i++) want[a[i]] = 1 } '
    "/^10de / { v = 1; next } "
    "v && /^[0-9a-f]/ { exit } "
    "v && /^\\t[0-9a-f][0-9a-f][0-9a-f][0-9a-f]  / "
    "{ id = substr($0, 2, 4); if (id in want) print m, id, substr($0, 8) }"
)


class PciGpus(FactBase[list[PciGpu]]):
    """
    Returns the NVIDIA GPUs (vendor 0x10de, class 0x03xxxx) found in sysfs.

    Needs no driver, pciutils or python on the host. Output lines are
    ``BUS VENDOR DEVICE CLASS SUBSYS_DEVICE SUBSYS_VENDOR`` (``-`` when unreadable),
    then ``##p40fleet-pci-name DEVICE NAME`` from the host's pci.ids (when it and awk
    exist): an id the catalog lacks is recognised from the chip family in that name.
    """

    default = list

    @override
    def command(self, devices_dir: str = SYSFS_PCI_DEVICES, pci_ids: str = PCI_IDS_FILES) -> str:
        reads = " ".join(f'"$(cat "$d/{name}" 2>/dev/null || echo -)"' for name in _SYSFS_FIELDS)
        files = " ".join(shlex.quote(f) for f in pci_ids.split())
        return (
            "ids=; "
            f"for d in {shlex.quote(devices_dir)}/*; do "
            '[ -r "$d/vendor" ] || continue; '
            f'echo "${{d##*/}}" {reads}; '
            'dev=$(cat "$d/device" 2>/dev/null); '
            '[ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] && ids="$ids ${dev#0x}"; '
            "done; "
            # the name is optional: no NVIDIA function, no pci.ids or no awk leaves it out
            'if [ -n "$ids" ] && command -v awk >/dev/null 2>&1; then '
            f"for f in {files}; do "
            '[ -r "$f" ] || continue; '
            f'awk -v ids="$ids" -v m={shlex.quote(PCI_NAME_MARKER)} '
            f'{shlex.quote(_PCI_NAME_AWK)} "$f"; '
            "break; done; fi; true"
        )

    @override
    def process(self, output: list[str]) -> list[PciGpu]:
        names: dict[int, str] = {}
        rows: list[list[str]] = []
        for line in output:
            if line.startswith(PCI_NAME_MARKER):
                _, _, rest = line.partition(" ")
                device_text, _, name = rest.strip().partition(" ")
                device = _int(device_text)
                if device is not None and name.strip():
                    names.setdefault(device, name.strip())
                continue
            rows.append(line.split())
        gpus = []
        for fields in rows:
            if len(fields) < 4:
                continue
            fields += ["-"] * (6 - len(fields))
            vendor, device, pci_class = (_int(f) for f in fields[1:4])
            if vendor != NVIDIA_VENDOR_ID or device is None or pci_class is None:
                continue
            if pci_class >> 16 != 0x03:
                continue
            gpus.append(
                PciGpu(
                    bus_id=fields[0].rsplit("/", 1)[-1].lower(),
                    vendor_id=vendor,
                    device_id=device,
                    pci_class=pci_class,
                    subsystem_device=_int(fields[4]),
                    subsystem_vendor=_int(fields[5]),
                    model=resolve(device, names.get(device)),
                    pci_name=names.get(device),
                )
            )
        return gpus


SMI_MARKER = "##p40fleet-nvidia-smi"
SMI_FIELDS = "index,name,pci.bus_id,pci.device_id,compute_cap,memory.total,driver_version"
SMI_FIELDS_R470 = "index,name,pci.bus_id,pci.device_id,memory.total,driver_version"

SMI_OK = "ok"
SMI_ABSENT = "absent"
SMI_NOT_LOADED = "not-loaded"
SMI_MISMATCH = "mismatch"
SMI_NO_DEVICES = "no-devices"


@dataclass(frozen=True)
class SmiGpu:
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
class SmiResult:
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


class NouveauLoaded(FactBase[bool]):
    """Returns whether the nouveau kernel module is loaded (``/sys/module/nouveau``)."""

    @override
    def command(self) -> str:
        return "if [ -d /sys/module/nouveau ]; then echo yes; else echo no; fi"

    @override
    def process(self, output: list[str]) -> bool:
        return any(line.strip() == "yes" for line in output)
