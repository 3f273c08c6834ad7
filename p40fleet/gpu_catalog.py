"""NVIDIA GPU catalog, keyed on the numeric PCI device id (vendor 0x10de).

Host ``pci.ids`` files are often too old to name newer GPUs (``Device 26b9``), so
everything here keys on the number and never on a name. Names and chips are the
``pci.ids`` entries (Debian bookworm ``pci.ids`` 0.0~2023.04.11; ids marked
``newer pci.ids`` are absent from that file and come from later releases).
Compute capabilities follow NVIDIA's CUDA GPU table. ``memory_gib`` is the
nominal memory of one PCI function (one GPU), ``None`` where one id covers
several sizes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NVIDIA_VENDOR_ID = 0x10DE


@dataclass(frozen=True)
class GpuModel:
    """One NVIDIA GPU model (one PCI device id)."""

    pci_id: int
    name: str
    chip: str
    arch: str
    compute_capability: tuple[int, int]
    memory_gib: int | None = None

    @property
    def pci_id_hex(self) -> str:
        """``10de:1b38`` form."""
        return f"{NVIDIA_VENDOR_ID:04x}:{self.pci_id:04x}"

    @property
    def capability_str(self) -> str:
        """``6.1`` form."""
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


KEPLER = "Kepler"
MAXWELL = "Maxwell"
PASCAL = "Pascal"
VOLTA = "Volta"
TURING = "Turing"
AMPERE = "Ampere"
ADA = "Ada Lovelace"
HOPPER = "Hopper"
BLACKWELL = "Blackwell"

# (pci id, chip, name, arch, capability, memory GiB or None)
_TABLE: tuple[tuple[int, str, str, str, tuple[int, int], int | None], ...] = (
    # Kepler
    (0x102D, "GK210GL", "Tesla K80", KEPLER, (3, 7), 12),
    (0x1023, "GK110BGL", "Tesla K40m", KEPLER, (3, 5), 12),
    (0x1024, "GK180GL", "Tesla K40c", KEPLER, (3, 5), 12),
    # Maxwell
    (0x13BD, "GM107GL", "Tesla M10", MAXWELL, (5, 0), 8),
    (0x17FD, "GM200GL", "Tesla M40", MAXWELL, (5, 2), None),  # 12 and 24 GB boards
    (0x13F2, "GM204GL", "Tesla M60", MAXWELL, (5, 2), 8),
    (0x1431, "GM206GL", "Tesla M4", MAXWELL, (5, 2), 4),
    # Pascal
    (0x15F7, "GP100GL", "Tesla P100 PCIe 12GB", PASCAL, (6, 0), 12),
    (0x15F8, "GP100GL", "Tesla P100 PCIe 16GB", PASCAL, (6, 0), 16),
    (0x15F9, "GP100GL", "Tesla P100 SXM2 16GB", PASCAL, (6, 0), 16),
    (0x1B38, "GP102GL", "Tesla P40", PASCAL, (6, 1), 24),
    (0x1BB3, "GP104GL", "Tesla P4", PASCAL, (6, 1), 8),
    (0x1B30, "GP102GL", "Quadro P6000", PASCAL, (6, 1), 24),
    (0x1BB0, "GP104GL", "Quadro P5000", PASCAL, (6, 1), 16),
    (0x1B00, "GP102", "TITAN X", PASCAL, (6, 1), 12),
    (0x1B02, "GP102", "TITAN Xp", PASCAL, (6, 1), 12),
    (0x1B06, "GP102", "GeForce GTX 1080 Ti", PASCAL, (6, 1), 11),
    (0x1B80, "GP104", "GeForce GTX 1080", PASCAL, (6, 1), 8),
    (0x1B81, "GP104", "GeForce GTX 1070", PASCAL, (6, 1), 8),
    (0x1B82, "GP104", "GeForce GTX 1070 Ti", PASCAL, (6, 1), 8),
    (0x1C02, "GP106", "GeForce GTX 1060 3GB", PASCAL, (6, 1), 3),
    (0x1C03, "GP106", "GeForce GTX 1060 6GB", PASCAL, (6, 1), 6),
    # Volta
    (0x1DB1, "GV100GL", "Tesla V100 SXM2 16GB", VOLTA, (7, 0), 16),
    (0x1DB4, "GV100GL", "Tesla V100 PCIe 16GB", VOLTA, (7, 0), 16),
    (0x1DB5, "GV100GL", "Tesla V100 SXM2 32GB", VOLTA, (7, 0), 32),
    (0x1DB6, "GV100GL", "Tesla V100 PCIe 32GB", VOLTA, (7, 0), 32),
    (0x1DB8, "GV100GL", "Tesla V100 SXM3 32GB", VOLTA, (7, 0), 32),
    (0x1DF6, "GV100GL", "Tesla V100S PCIe 32GB", VOLTA, (7, 0), 32),
    (0x1D81, "GV100", "TITAN V", VOLTA, (7, 0), 12),
    # Turing
    (0x1EB8, "TU104GL", "Tesla T4", TURING, (7, 5), 16),
    (0x1E02, "TU102", "TITAN RTX", TURING, (7, 5), 24),
    (0x1E04, "TU102", "GeForce RTX 2080 Ti", TURING, (7, 5), 11),
    (0x1E07, "TU102", "GeForce RTX 2080 Ti Rev. A", TURING, (7, 5), 11),
    (0x1E82, "TU104", "GeForce RTX 2080", TURING, (7, 5), 8),
    (0x1E87, "TU104", "GeForce RTX 2080 Rev. A", TURING, (7, 5), 8),
    (0x1E30, "TU102GL", "Quadro RTX 6000/8000", TURING, (7, 5), None),
    (0x1E36, "TU102GL", "Quadro RTX 6000", TURING, (7, 5), 24),
    (0x1E78, "TU102GL", "Quadro RTX 6000/8000", TURING, (7, 5), None),
    # Ampere
    (0x20B0, "GA100", "A100 SXM4 40GB", AMPERE, (8, 0), 40),
    (0x20B1, "GA100", "A100 PCIe 40GB", AMPERE, (8, 0), 40),
    (0x20B2, "GA100", "A100 SXM4 80GB", AMPERE, (8, 0), 80),
    (0x20B5, "GA100", "A100 PCIe 80GB", AMPERE, (8, 0), 80),
    (0x20F1, "GA100", "A100 PCIe 40GB", AMPERE, (8, 0), 40),
    (0x20F3, "GA100", "A800-SXM4-80GB", AMPERE, (8, 0), 80),
    (0x20B7, "GA100GL", "A30 PCIe", AMPERE, (8, 0), 24),
    (0x2236, "GA102GL", "A10", AMPERE, (8, 6), 24),
    (0x2235, "GA102GL", "A40", AMPERE, (8, 6), 48),
    (0x2230, "GA102GL", "RTX A6000", AMPERE, (8, 6), 48),
    (0x2204, "GA102", "GeForce RTX 3090", AMPERE, (8, 6), 24),
    (0x2206, "GA102", "GeForce RTX 3080", AMPERE, (8, 6), 10),
    (0x2208, "GA102", "GeForce RTX 3080 Ti", AMPERE, (8, 6), 12),
    (0x2216, "GA102", "GeForce RTX 3080 Lite Hash Rate", AMPERE, (8, 6), 10),
    (0x2484, "GA104", "GeForce RTX 3070", AMPERE, (8, 6), 8),
    (0x2482, "GA104", "GeForce RTX 3070 Ti", AMPERE, (8, 6), 8),
    # Ada Lovelace
    (0x27B8, "AD104GL", "L4", ADA, (8, 9), 24),
    (0x26B5, "AD102GL", "L40", ADA, (8, 9), 48),
    (0x26B9, "AD102GL", "L40S", ADA, (8, 9), 48),  # newer pci.ids
    (0x26B1, "AD102GL", "L6000 / RTX 6000 Ada Generation", ADA, (8, 9), 48),
    (0x2684, "AD102", "GeForce RTX 4090", ADA, (8, 9), 24),
    (0x2704, "AD103", "GeForce RTX 4080", ADA, (8, 9), 16),
    # Hopper
    (0x2330, "GH100", "H100 SXM5 80GB", HOPPER, (9, 0), 80),
    (0x2331, "GH100", "H100 PCIe", HOPPER, (9, 0), 80),
    (0x2339, "GH100", "H100", HOPPER, (9, 0), None),
    (0x2322, "GH100", "H800 PCIe", HOPPER, (9, 0), 80),
    (0x2324, "GH100", "H800", HOPPER, (9, 0), 80),
    (0x2335, "GH100", "H200 SXM 141GB", HOPPER, (9, 0), 141),  # newer pci.ids
    (0x2342, "GH100", "GH200 120GB / 480GB", HOPPER, (9, 0), None),  # newer pci.ids
    # Blackwell
    (0x2901, "GB100", "B200", BLACKWELL, (10, 0), None),  # newer pci.ids
    (0x2B85, "GB202", "GeForce RTX 5090", BLACKWELL, (12, 0), 32),  # newer pci.ids
)

CATALOG: dict[int, GpuModel] = {
    row[0]: GpuModel(
        pci_id=row[0],
        chip=row[1],
        name=row[2],
        arch=row[3],
        compute_capability=row[4],
        memory_gib=row[5],
    )
    for row in _TABLE
}

_HEX = re.compile(r"^(?:0x)?([0-9a-f]{1,8})$")


def parse_pci_id(value: str | int) -> tuple[int, int] | None:
    """Parse a PCI id into ``(vendor, device)``; ``None`` when it is not one.

    Accepted (any case): ``1b38`` / ``0x1b38`` (device only, vendor assumed NVIDIA),
    ``10de:1b38`` and nvidia-smi's ``0x1B3810DE`` (device high 16 bits, vendor low).
    An ``int`` is a device id when <= 0xffff, else the nvidia-smi 32-bit form.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = value
        text_len = 4 if value <= 0xFFFF else 8
    else:
        text = value.strip().lower()
        if ":" in text:
            vendor_text, _, device_text = text.partition(":")
            vendor = _hex(vendor_text, 4)
            device = _hex(device_text, 4)
            if vendor is None or device is None:
                return None
            return vendor, device
        match = _HEX.match(text)
        if match is None:
            return None
        number = int(match.group(1), 16)
        text_len = 4 if len(match.group(1)) <= 4 else 8
    if number < 0 or number > 0xFFFFFFFF:
        return None
    if text_len == 4:
        return NVIDIA_VENDOR_ID, number
    return number & 0xFFFF, number >> 16


def _hex(text: str, width: int) -> int | None:
    text = text.strip().lower().removeprefix("0x")
    if not text or len(text) > width or any(c not in "0123456789abcdef" for c in text):
        return None
    return int(text, 16)


def normalize_bus_id(bus_id: str) -> str:
    """``00000000:00:06.0`` (nvidia-smi) -> ``0000:00:06.0`` (sysfs), lower case."""
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if sep and rest.count(":") == 1 and len(domain) > 4:
        domain = domain[-4:]
    return f"{domain}{sep}{rest}"


def lookup(pci_id: str | int) -> GpuModel | None:
    """Return the model for an NVIDIA PCI id, or ``None``.

    ``None`` for an unknown device, a non-NVIDIA vendor, or text that is not a
    PCI id at all (it never raises). See :func:`parse_pci_id` for the forms.
    """
    parsed = parse_pci_id(pci_id)
    if parsed is None:
        return None
    vendor, device = parsed
    if vendor != NVIDIA_VENDOR_ID:
        return None
    return CATALOG.get(device)
