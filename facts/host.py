"""Host facts the GPU stack needs: OS, running kernel + headers, free space, CPUs, memory.

Reuses pyinfra's built-ins where they fit (``LinuxDistribution`` tolerates a
missing ``/etc/*-release``; ``Cpus`` uses ``getconf``). Every command here
exits 0 on a minimal host.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase
from pyinfra.facts.hardware import Cpus
from pyinfra.facts.server import LinuxDistribution, LinuxDistributionDict
from typing_extensions import override

from p40fleet.jsonable import ToJson

__all__ = [
    "Cpus",
    "FreeSpace",
    "FreeSpaceInfo",
    "KernelHeaders",
    "KernelInfo",
    "LinuxDistribution",
    "MemTotal",
    "os_label",
]


def os_label(distribution: LinuxDistributionDict | None) -> str:
    """``Ubuntu 20.04`` style label from ``LinuxDistribution``; ``unknown OS`` if empty."""
    if not distribution or not distribution.get("name"):
        return "unknown OS"
    meta = distribution.get("release_meta") or {}
    version = meta.get("VERSION_ID")
    if not version and distribution.get("major") is not None:
        version = str(distribution["major"])
        if distribution.get("minor") is not None:
            version += f".{distribution['minor']}"
    return f"{distribution['name']} {version}" if version else str(distribution["name"])


@dataclass(frozen=True)
class KernelInfo(ToJson):
    """The running kernel and whether its build tree (headers) is installed."""

    release: str | None
    headers_path: str | None
    headers_installed: bool


class KernelHeaders(FactBase[KernelInfo]):
    """
    Returns ``KernelInfo`` for the running kernel (``uname -r``) and whether
    ``/lib/modules/$(uname -r)/build`` exists (the driver build needs it).
    """

    @staticmethod
    @override
    def default() -> KernelInfo:
        return KernelInfo(release=None, headers_path=None, headers_installed=False)

    @override
    def command(self) -> str:
        return (
            'r=$(uname -r 2>/dev/null); echo "release=$r"; '
            'if [ -n "$r" ] && [ -e "/lib/modules/$r/build" ]; '
            "then echo headers=yes; else echo headers=no; fi"
        )

    @override
    def process(self, output: list[str]) -> KernelInfo:
        values = dict(line.strip().split("=", 1) for line in output if "=" in line)
        release = values.get("release") or None
        return KernelInfo(
            release=release,
            headers_path=f"/lib/modules/{release}/build" if release else None,
            headers_installed=values.get("headers") == "yes",
        )


@dataclass(frozen=True)
class FreeSpaceInfo(ToJson):
    """Free space for ``path``, measured on its nearest existing ancestor."""

    path: str
    measured_path: str
    mount_point: str | None
    total_bytes: int | None
    available_bytes: int | None


class FreeSpace(FactBase[FreeSpaceInfo | None]):
    """
    Returns ``FreeSpaceInfo`` for ``path`` (walking up to the nearest existing
    parent), from ``df -P -B1`` (``df -Pk`` where ``-B1`` is unsupported), or
    ``None`` when ``df`` gives nothing.
    """

    @override
    def command(self, path: str) -> str:
        self._path = path
        return (
            f"p={shlex.quote(path)}; "
            'while [ ! -e "$p" ] && [ "$p" != / ] && [ "$p" != . ]; do p=$(dirname "$p"); done; '
            'echo "measured=$p"; '
            'if out=$(df -P -B1 "$p" 2>/dev/null); then echo unit=1; '
            'elif out=$(df -Pk "$p" 2>/dev/null); then echo unit=1024; fi; '
            'printf "%s\\n" "$out" | tail -n 1; true'
        )

    @override
    def process(self, output: list[str]) -> FreeSpaceInfo | None:
        measured = unit = None
        row: list[str] = []
        for line in output:
            if line.startswith("measured="):
                measured = line.split("=", 1)[1]
            elif line.startswith("unit="):
                unit = int(line.split("=", 1)[1])
            elif line.strip():
                row = line.split()
        if measured is None or unit is None or len(row) < 6:
            return None
        try:
            total, available = int(row[1]) * unit, int(row[3]) * unit
        except ValueError:
            return None
        return FreeSpaceInfo(
            path=getattr(self, "_path", measured),
            measured_path=measured,
            mount_point=" ".join(row[5:]),
            total_bytes=total,
            available_bytes=available,
        )


class MemTotal(FactBase[int | None]):
    """Returns ``MemTotal`` from ``/proc/meminfo`` in bytes, or ``None``."""

    @override
    def command(self) -> str:
        return "cat /proc/meminfo 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> int | None:
        for line in output:
            if line.startswith("MemTotal:"):
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    scale = 1024 if len(parts) < 3 or parts[2].lower() == "kb" else 1
                    return int(parts[1]) * scale
        return None
