"""The NVIDIA driver runfile double (``NVIDIA-Linux-x86_64-VERSION.run``)."""

from __future__ import annotations

from pathlib import Path

from p40lab import doubles
from p40lab.artifacts.archive import Tree, fill, makeself
from p40lab.artifacts.elf import kernel_module, shared_lib


def build_driver(version: str, kernel_release: str, work: Path) -> bytes:
    tree = Tree()
    tree.file(
        "nvidia-installer", fill(doubles.source("nvidia-installer.sh"), VERSION=version), 0o755
    )
    tree.file("nvidia-smi", fill(doubles.source("nvidia-smi.py"), VERSION=version), 0o755)
    for mod in ("nvidia", "nvidia-modeset", "nvidia-drm", "nvidia-uvm"):
        tree.file(f"kernel/{mod}.ko", kernel_module(mod, version, kernel_release, work))
    tree.file(f"libnvidia-ml.so.{version}", shared_lib("libnvidia-ml.so.1", work), 0o755)
    tree.file(".version", version + "\n")
    return makeself(
        tree,
        label=f"NVIDIA Accelerated Graphics Driver for Linux-x86_64 {version}",
        script="nvidia-installer",
        targetname=f"NVIDIA-Linux-x86_64-{version}",
    )
