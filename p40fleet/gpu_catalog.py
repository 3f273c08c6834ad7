"""NVIDIA GPU catalog, keyed on the numeric PCI device id (vendor 0x10de).

Host ``pci.ids`` files are often too old to name newer GPUs (``Device 26b9``), so
everything here keys on the number and never on a name. Names and chips are the
``pci.ids`` entries (Debian bookworm ``pci.ids`` 0.0~2023.04.11; ids marked
``newer pci.ids`` are absent from that file and come from later releases).
Compute capabilities follow NVIDIA's CUDA GPU table. ``memory_gib`` is the
nominal memory of one PCI function (one GPU), ``None`` where one id covers
several sizes.

An id the catalog lacks is still recognised when the host's ``pci.ids`` names
it: the chip family at the start of that name (``GP102 [GeForce GTX 1080 Ti]``)
gives the architecture and compute capability (:func:`resolve`).
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
    #: ``None`` for a catalog entry; else how the capability was derived
    #: (``cc from chip family GP102 in pci.ids name``).
    derived_from: str | None = None

    @property
    def pci_id_hex(self) -> str:
        """``10de:1b38`` form."""
        return f"{NVIDIA_VENDOR_ID:04x}:{self.pci_id:04x}"

    @property
    def capability_str(self) -> str:
        """``6.1`` form."""
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


FERMI = "Fermi"
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
    (0x118F, "GK104GL", "Tesla K10", KEPLER, (3, 0), 4),  # two GPUs of 4 GB per board
    (0x1022, "GK110GL", "Tesla K20c", KEPLER, (3, 5), 5),
    (0x1028, "GK110GL", "Tesla K20m", KEPLER, (3, 5), 5),
    (0x1021, "GK110GL", "Tesla K20Xm", KEPLER, (3, 5), 6),
    (0x1004, "GK110", "GeForce GTX 780", KEPLER, (3, 5), None),  # 3 and 6 GB boards
    (0x100A, "GK110B", "GeForce GTX 780 Ti", KEPLER, (3, 5), 3),
    (0x1005, "GK110", "GeForce GTX TITAN", KEPLER, (3, 5), 6),
    (0x100C, "GK110B", "GeForce GTX TITAN Black", KEPLER, (3, 5), 6),
    (0x1180, "GK104", "GeForce GTX 680", KEPLER, (3, 0), None),
    (0x1184, "GK104", "GeForce GTX 770", KEPLER, (3, 0), None),
    (0x1187, "GK104", "GeForce GTX 760", KEPLER, (3, 0), None),
    (0x128B, "GK208B", "GeForce GT 710", KEPLER, (3, 5), None),
    (0x1287, "GK208B", "GeForce GT 730", KEPLER, (3, 5), None),
    # Maxwell
    (0x13BD, "GM107GL", "Tesla M10", MAXWELL, (5, 0), 8),
    (0x17FD, "GM200GL", "Tesla M40", MAXWELL, (5, 2), None),  # 12 and 24 GB boards
    (0x13F2, "GM204GL", "Tesla M60", MAXWELL, (5, 2), 8),
    (0x1431, "GM206GL", "Tesla M4", MAXWELL, (5, 2), 4),
    (0x17C2, "GM200", "GeForce GTX TITAN X", MAXWELL, (5, 2), 12),
    (0x17C8, "GM200", "GeForce GTX 980 Ti", MAXWELL, (5, 2), 6),
    (0x17F0, "GM200GL", "Quadro M6000", MAXWELL, (5, 2), 12),
    (0x17F1, "GM200GL", "Quadro M6000 24GB", MAXWELL, (5, 2), 24),
    (0x13F1, "GM204GL", "Quadro M4000", MAXWELL, (5, 2), 8),
    (0x13C0, "GM204", "GeForce GTX 980", MAXWELL, (5, 2), 4),
    (0x13C2, "GM204", "GeForce GTX 970", MAXWELL, (5, 2), 4),
    (0x1401, "GM206", "GeForce GTX 960", MAXWELL, (5, 2), None),
    (0x1402, "GM206", "GeForce GTX 950", MAXWELL, (5, 2), None),
    (0x1380, "GM107", "GeForce GTX 750 Ti", MAXWELL, (5, 0), None),
    (0x1381, "GM107", "GeForce GTX 750", MAXWELL, (5, 0), None),
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
    (0x1C81, "GP107", "GeForce GTX 1050", PASCAL, (6, 1), 2),
    (0x1C82, "GP107", "GeForce GTX 1050 Ti", PASCAL, (6, 1), 4),
    (0x1D01, "GP108", "GeForce GT 1030", PASCAL, (6, 1), 2),
    (0x1BB1, "GP104GL", "Quadro P4000", PASCAL, (6, 1), 8),
    (0x1C30, "GP106GL", "Quadro P2000", PASCAL, (6, 1), 5),
    # Volta
    (0x1DB1, "GV100GL", "Tesla V100 SXM2 16GB", VOLTA, (7, 0), 16),
    (0x1DB4, "GV100GL", "Tesla V100 PCIe 16GB", VOLTA, (7, 0), 16),
    (0x1DB5, "GV100GL", "Tesla V100 SXM2 32GB", VOLTA, (7, 0), 32),
    (0x1DB6, "GV100GL", "Tesla V100 PCIe 32GB", VOLTA, (7, 0), 32),
    (0x1DB8, "GV100GL", "Tesla V100 SXM3 32GB", VOLTA, (7, 0), 32),
    (0x1DF6, "GV100GL", "Tesla V100S PCIe 32GB", VOLTA, (7, 0), 32),
    (0x1D81, "GV100", "TITAN V", VOLTA, (7, 0), 12),
    (0x1DBA, "GV100GL", "Quadro GV100", VOLTA, (7, 0), 32),
    # Turing
    (0x1EB8, "TU104GL", "Tesla T4", TURING, (7, 5), 16),
    (0x1E02, "TU102", "TITAN RTX", TURING, (7, 5), 24),
    (0x1E04, "TU102", "GeForce RTX 2080 Ti", TURING, (7, 5), 11),
    (0x1E07, "TU102", "GeForce RTX 2080 Ti Rev. A", TURING, (7, 5), 11),
    (0x1E82, "TU104", "GeForce RTX 2080", TURING, (7, 5), 8),
    (0x1E87, "TU104", "GeForce RTX 2080 Rev. A", TURING, (7, 5), 8),
    (0x1E81, "TU104", "GeForce RTX 2080 SUPER", TURING, (7, 5), 8),
    (0x1E84, "TU104", "GeForce RTX 2070 SUPER", TURING, (7, 5), 8),
    (0x1F02, "TU106", "GeForce RTX 2070", TURING, (7, 5), 8),
    (0x1F07, "TU106", "GeForce RTX 2070 Rev. A", TURING, (7, 5), 8),
    (0x1F06, "TU106", "GeForce RTX 2060 SUPER", TURING, (7, 5), 8),
    (0x1F08, "TU106", "GeForce RTX 2060 Rev. A", TURING, (7, 5), 6),
    (0x2182, "TU116", "GeForce GTX 1660 Ti", TURING, (7, 5), 6),
    (0x2184, "TU116", "GeForce GTX 1660", TURING, (7, 5), 6),
    (0x21C4, "TU116", "GeForce GTX 1660 SUPER", TURING, (7, 5), 6),
    (0x1F82, "TU117", "GeForce GTX 1650", TURING, (7, 5), 4),
    (0x1EB0, "TU104GL", "Quadro RTX 5000", TURING, (7, 5), 16),
    (0x1EB1, "TU104GL", "Quadro RTX 4000", TURING, (7, 5), 8),
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
    (0x2231, "GA102GL", "RTX A5000", AMPERE, (8, 6), 24),
    (0x24B0, "GA104GL", "RTX A4000", AMPERE, (8, 6), 16),
    (0x25B6, "GA107GL", "A2 / A16", AMPERE, (8, 6), 16),
    (0x2203, "GA102", "GeForce RTX 3090 Ti", AMPERE, (8, 6), 24),
    (0x2204, "GA102", "GeForce RTX 3090", AMPERE, (8, 6), 24),
    (0x2206, "GA102", "GeForce RTX 3080", AMPERE, (8, 6), 10),
    (0x2208, "GA102", "GeForce RTX 3080 Ti", AMPERE, (8, 6), 12),
    (0x2216, "GA102", "GeForce RTX 3080 Lite Hash Rate", AMPERE, (8, 6), 10),
    (0x2484, "GA104", "GeForce RTX 3070", AMPERE, (8, 6), 8),
    (0x2482, "GA104", "GeForce RTX 3070 Ti", AMPERE, (8, 6), 8),
    (0x2486, "GA104", "GeForce RTX 3060 Ti", AMPERE, (8, 6), 8),
    (0x2503, "GA106", "GeForce RTX 3060", AMPERE, (8, 6), None),  # 8 and 12 GB boards
    # Ada Lovelace
    (0x27B8, "AD104GL", "L4", ADA, (8, 9), 24),
    (0x26B5, "AD102GL", "L40", ADA, (8, 9), 48),
    (0x26B9, "AD102GL", "L40S", ADA, (8, 9), 48),  # newer pci.ids
    (0x26B1, "AD102GL", "L6000 / RTX 6000 Ada Generation", ADA, (8, 9), 48),
    (0x2684, "AD102", "GeForce RTX 4090", ADA, (8, 9), 24),
    (0x2704, "AD103", "GeForce RTX 4080", ADA, (8, 9), 16),
    (0x2782, "AD104", "GeForce RTX 4070 Ti", ADA, (8, 9), 12),
    (0x2786, "AD104", "GeForce RTX 4070", ADA, (8, 9), 12),
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


# Chip family -> (architecture, compute capability), from NVIDIA's CUDA GPU table
# (developer.nvidia.com/cuda-gpus) read by chip: e.g. GTX 680 (GK104) 3.0, K40
# (GK110B) 3.5, GT 710 (GK208) 3.5, K80 (GK210) 3.7, GTX 750 Ti (GM107) 5.0,
# M40 (GM200) 5.2, P100 (GP100) 6.0, P40 (GP102) 6.1, V100 (GV100) 7.0, T4
# (TU104) 7.5, A100 (GA100) 8.0, A10 (GA102) 8.6, L40 (AD102) 8.9, H100 (GH100)
# 9.0, B200 (GB100) 10.0, RTX 5090 (GB202) 12.0. Only discrete PCI chips: the
# Tegra ones (GM20B 5.3, GP10B 6.2, GV10B 7.2, GA10B 8.7) never show up in sysfs
# as an NVIDIA PCI GPU. Fermi is here so that its refusal names the capability.
def _families(
    arch: str, capability: tuple[int, int], *chips: str
) -> dict[str, tuple[str, tuple[int, int]]]:
    return {chip: (arch, capability) for chip in chips}


CHIP_FAMILIES: dict[str, tuple[str, tuple[int, int]]] = {
    **_families(FERMI, (2, 0), "GF100", "GF110"),
    **_families(FERMI, (2, 1), "GF104", "GF106", "GF108", "GF114", "GF116", "GF117", "GF119"),
    **_families(KEPLER, (3, 0), "GK104", "GK106", "GK107"),
    **_families(KEPLER, (3, 5), "GK110", "GK180", "GK208"),
    **_families(KEPLER, (3, 7), "GK210"),
    **_families(MAXWELL, (5, 0), "GM107", "GM108"),
    **_families(MAXWELL, (5, 2), "GM200", "GM204", "GM206"),
    **_families(PASCAL, (6, 0), "GP100"),
    **_families(PASCAL, (6, 1), "GP102", "GP104", "GP106", "GP107", "GP108"),
    **_families(VOLTA, (7, 0), "GV100"),
    **_families(TURING, (7, 5), "TU102", "TU104", "TU106", "TU116", "TU117"),
    **_families(AMPERE, (8, 0), "GA100"),
    **_families(AMPERE, (8, 6), "GA102", "GA103", "GA104", "GA106", "GA107"),
    **_families(ADA, (8, 9), "AD102", "AD103", "AD104", "AD106", "AD107"),
    **_families(HOPPER, (9, 0), "GH100"),
    **_families(BLACKWELL, (10, 0), "GB100", "GB102"),
    **_families(BLACKWELL, (12, 0), "GB202", "GB203", "GB205", "GB206", "GB207"),
}

# A chip code as pci.ids writes it: family + 3 digits + an optional variant suffix
# (GK110B, GP102GL, GM204GLM, TU116M); Debian's file has "GH100[H100 SXM5 80GB]" too.
_CHIP = re.compile(r"(?<![A-Za-z0-9])((?:G[FKMPVHB]|TU|GA|AD)\d{3})[A-Z]*(?![a-z0-9])")
_BRACKETED = re.compile(r"\[([^\]]+)\]")


def chip_family(pci_name: str) -> str | None:
    """The chip family (``GP102``) named before the ``[`` of a pci.ids name, or ``None``.

    Takes the name alone (``GP102 [GeForce GTX 1080 Ti]``) or as lspci prints it
    (``NVIDIA Corporation GP102GL [Tesla P40]``); the bracketed product name is
    never read, so a marketing name cannot pass for a chip.
    """
    match = _CHIP.search(pci_name.split("[", 1)[0])
    return match.group(1) if match else None


def derive_model(pci_id: int, pci_name: str | None) -> GpuModel | None:
    """A model for an id the catalog lacks, from the chip family in its pci.ids name.

    ``None`` when there is no name (``Device 1eb8`` from an old pci.ids) or the
    family is not in :data:`CHIP_FAMILIES`.
    """
    if not pci_name:
        return None
    family = chip_family(pci_name)
    if family is None or family not in CHIP_FAMILIES:
        return None
    arch, capability = CHIP_FAMILIES[family]
    chip = pci_name.strip().split("[", 1)[0].strip() or family
    bracketed = _BRACKETED.search(pci_name)
    return GpuModel(
        pci_id=pci_id,
        name=bracketed.group(1).strip() if bracketed else pci_name.strip(),
        chip=chip,
        arch=arch,
        compute_capability=capability,
        memory_gib=None,
        derived_from=f"cc from chip family {family} in pci.ids name",
    )


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


def resolve(pci_id: str | int, pci_name: str | None = None) -> GpuModel | None:
    """The catalog's model for ``pci_id``, else one derived from its pci.ids name.

    ``None`` when neither knows the id: callers refuse it, naming the id.
    """
    model = lookup(pci_id)
    if model is not None:
        return model
    parsed = parse_pci_id(pci_id)
    if parsed is None or parsed[0] != NVIDIA_VENDOR_ID:
        return None
    return derive_model(parsed[1], pci_name)
