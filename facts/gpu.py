"""GPU facts: the NVIDIA PCI functions from sysfs, before any driver.

The driver's facts (nvidia-smi, the installed and loaded module) are in ``facts.driver``, nouveau's
in ``facts.nouveau``. Every command here exits 0 on any host (no GPU, no sysfs) and encodes what
it saw in its output, so gathering facts never fails a host.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase
from typing_extensions import override

from p40fleet.gpu_catalog import (
    NVIDIA_VENDOR_ID,
    GpuModel,
    resolve,
)
from p40fleet.jsonable import ToJson


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


@dataclass(frozen=True)
class PciGpu(ToJson):
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
