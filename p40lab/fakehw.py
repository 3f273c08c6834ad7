"""Fake PCI hardware for a lab host: a sysfs-shaped tree written into the host's rootfs.

No real sysfs is mounted inside a host, so ``<rootfs>/sys`` *is* its ``/sys``::

    /sys/devices/pci0000:00/<bdf>/{vendor,device,class,subsystem_vendor,subsystem_device,
                                   revision,config,numa_node,modalias,...}
    /sys/bus/pci/devices/<bdf> -> ../../../devices/pci0000:00/<bdf>
    /sys/bus/pci/drivers/<drv>/<bdf> + <dev>/driver   (written by the boot hook, p40lab.boot)

``config`` is the 256-byte binary header (lspci's sysfs backend needs it). GPUs sit at
``0000:<04+i>:00.0`` with numa_node ``i // 4``; a host bridge and a NIC are always present.

GPU layouts (``--gpus`` per host): ``4xP40``, ``8xP40``, ``1xP100``, ``2xH200``, ``0`` (none),
``2x1b38`` / ``2x10de:1b38`` (raw PCI ids), ``P40`` (= 1xP40); ``+`` joins groups (``2xP40+1xT4``).
"""

from __future__ import annotations

import re
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

NVIDIA = 0x10DE
CLASS_3D = 0x030200


@dataclass(frozen=True)
class GpuModel:
    name: str
    device: int
    subsys_device: int
    full_name: str = ""
    memory_mib: int = 0
    compute_cap: str = ""
    cls: int = CLASS_3D
    vendor: int = NVIDIA
    subsys_vendor: int = NVIDIA
    rev: int = 0xA1

    @property
    def pci_id(self) -> str:
        return f"{self.vendor:04x}:{self.device:04x}"


MODELS: dict[str, GpuModel] = {
    m.name.upper(): m
    for m in (
        GpuModel("P40", 0x1B38, 0x11D9, "Tesla P40", 24576, "6.1"),
        GpuModel("P100", 0x15F8, 0x118F, "Tesla P100-PCIE-16GB", 16384, "6.0"),
        GpuModel("V100", 0x1DB4, 0x1214, "Tesla V100-PCIE-16GB", 16384, "7.0"),
        GpuModel("T4", 0x1EB8, 0x12A2, "Tesla T4", 15360, "7.5"),
        GpuModel("A100", 0x20B0, 0x134F, "NVIDIA A100-SXM4-40GB", 40960, "8.0"),
        GpuModel("H100", 0x2330, 0x16C1, "NVIDIA H100 80GB HBM3", 81559, "9.0"),
        GpuModel("H200", 0x2335, 0x18BF, "NVIDIA H200", 143771, "9.0"),
        GpuModel("K80", 0x102D, 0x106C, "Tesla K80", 11441, "3.7"),
    )
}


class LayoutError(ValueError):
    pass


def _model(token: str) -> GpuModel:
    key = token.strip().upper()
    if key in MODELS:
        return MODELS[key]
    m = re.fullmatch(r"(?:(?P<ven>[0-9a-f]{4}):)?(?P<dev>[0-9a-f]{4})", token.strip().lower())
    if not m:
        known = ", ".join(MODELS)
        raise LayoutError(f"unknown GPU {token!r}: use a model ({known}) or a hex id like 1b38")
    vendor = int(m["ven"], 16) if m["ven"] else NVIDIA
    device = int(m["dev"], 16)
    for model in MODELS.values():
        if (model.vendor, model.device) == (vendor, device):
            return model
    name = f"{vendor:04x}:{device:04x}"
    return GpuModel(name, device, 0, f"PCI device {name}", vendor=vendor, subsys_vendor=vendor)


def parse_layout(layout: str) -> list[GpuModel]:
    """'4xP40' -> [P40]*4; '0' -> []; '2xP40+1xT4' -> mixed."""
    layout = layout.strip()
    if layout in ("", "0", "none"):
        return []
    gpus: list[GpuModel] = []
    for part in layout.split("+"):
        m = re.fullmatch(r"\s*(?:(\d+)\s*[xX*])?\s*(\S+)\s*", part)
        if not m:
            raise LayoutError(f"bad GPU layout {part!r} (expected e.g. 4xP40)")
        count = int(m[1]) if m[1] is not None else 1
        if count > 32:
            raise LayoutError(f"{count} GPUs in {part!r}: at most 32 per group")
        gpus += [_model(m[2])] * count
    return gpus


def gpu_bdf(index: int) -> str:
    return f"0000:{0x04 + index:02x}:00.0"


def config_space(vendor, device, cls, rev, sub_vendor, sub_device) -> bytes:
    cfg = bytearray(256)
    struct.pack_into("<HH", cfg, 0x00, vendor, device)
    struct.pack_into("<HH", cfg, 0x04, 0x0007, 0x0010)  # command io|mem|master, status: caps
    cfg[0x08] = rev
    cfg[0x09], cfg[0x0A], cfg[0x0B] = cls & 0xFF, (cls >> 8) & 0xFF, (cls >> 16) & 0xFF
    struct.pack_into("<HH", cfg, 0x2C, sub_vendor, sub_device)
    cfg[0x3D] = 1  # interrupt pin A
    return bytes(cfg)


def write_device(
    sysroot: Path, bdf: str, vendor: int, device: int, cls: int, *,
    rev: int = 0xA1, sub_vendor: int = 0, sub_device: int = 0, numa: int = 0,
) -> None:  # fmt: skip
    ddir = sysroot / "devices/pci0000:00" / bdf
    ddir.mkdir(parents=True, exist_ok=True)
    modalias = (
        f"pci:v0000{vendor:04X}d0000{device:04X}sv0000{sub_vendor:04X}sd0000{sub_device:04X}"
        f"bc{cls >> 16:02X}sc{(cls >> 8) & 0xFF:02X}i{cls & 0xFF:02X}"
    )
    attrs = {
        "vendor": f"0x{vendor:04x}", "device": f"0x{device:04x}", "class": f"0x{cls:06x}",
        "subsystem_vendor": f"0x{sub_vendor:04x}", "subsystem_device": f"0x{sub_device:04x}",
        "revision": f"0x{rev:02x}", "irq": "0", "numa_node": str(numa), "enable": "1",
        "local_cpulist": "0-1", "current_link_speed": "8.0 GT/s PCIe",
        "current_link_width": "16", "max_link_speed": "8.0 GT/s PCIe", "max_link_width": "16",
        "modalias": modalias,
        "resource": "\n".join(["0x0000000000000000 0x0000000000000000 0x0000000000000000"] * 13),
    }  # fmt: skip
    for key, value in attrs.items():
        (ddir / key).write_text(value + "\n")
    (ddir / "config").write_bytes(config_space(vendor, device, cls, rev, sub_vendor, sub_device))
    link = sysroot / "bus/pci/devices" / bdf
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(f"../../../devices/pci0000:00/{bdf}")


def write_tree(rootfs: Path, gpus: list[GpuModel]) -> None:
    """(Re)write the host's PCI tree: the old devices/bus trees are replaced, /sys/module kept."""
    sysroot = rootfs / "sys"
    for sub in ("devices", "bus"):
        shutil.rmtree(sysroot / sub, ignore_errors=True)
    write_device(sysroot, "0000:00:00.0", 0x8086, 0x2020, 0x060000, rev=0x04)
    write_device(sysroot, "0000:00:1f.6", 0x8086, 0x15BB, 0x020000, rev=0x10, sub_vendor=0x8086)
    for i, gpu in enumerate(gpus):
        write_device(
            sysroot, gpu_bdf(i), gpu.vendor, gpu.device, gpu.cls, rev=gpu.rev,
            sub_vendor=gpu.subsys_vendor, sub_device=gpu.subsys_device, numa=i // 4,
        )  # fmt: skip
    (sysroot / "module").mkdir(parents=True, exist_ok=True)


def describe(gpus: list[GpuModel]) -> list[dict]:
    """JSON-able description (written to /var/lib/p40lab-sim/hardware.json in each host)."""
    return [
        {
            "index": i,
            "bdf": gpu_bdf(i),
            "model": g.name,
            "name": g.full_name,
            "pci_id": g.pci_id,
            "subsystem": f"{g.subsys_vendor:04x}:{g.subsys_device:04x}",
            "memory_mib": g.memory_mib,
            "compute_cap": g.compute_cap,
            "numa_node": i // 4,
        }  # fmt: skip
        for i, g in enumerate(gpus)
    ]


def nvidia_gpus(sysroot: Path) -> list[str]:
    """BDFs of NVIDIA display-class devices in a fake tree."""
    found = []
    for dev in sorted((sysroot / "bus/pci/devices").glob("*")):
        try:
            vendor = (dev / "vendor").read_text().strip()
            cls = (dev / "class").read_text().strip()
        except OSError:
            continue
        if vendor == f"0x{NVIDIA:04x}" and cls.startswith("0x03"):
            found.append(dev.name)
    return found


def bind_driver(sysroot: Path, driver: str | None) -> None:
    """Bind every NVIDIA GPU to ``driver`` (None: unbound) in the fake tree."""
    drivers = sysroot / "bus/pci/drivers"
    for name in ("nouveau", "nvidia"):
        shutil.rmtree(drivers / name, ignore_errors=True)
    for bdf in nvidia_gpus(sysroot):
        link = sysroot / "devices/pci0000:00" / bdf / "driver"
        if link.is_symlink() or link.exists():
            link.unlink()
        if driver:
            (drivers / driver).mkdir(parents=True, exist_ok=True)
            (drivers / driver / bdf).symlink_to(f"../../../../devices/pci0000:00/{bdf}")
            link.symlink_to(f"../../../bus/pci/drivers/{driver}")
