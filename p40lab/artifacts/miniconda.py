"""The Miniconda installer double (its conda is :mod:`p40lab.doubles` ``conda.py``)."""

from __future__ import annotations

from p40lab import doubles
from p40lab.artifacts.archive import Tree, fill
from p40lab.artifacts.pins import CONDA_VERSION, MINICONDA_VERSION


def build_miniconda(
    version: str = MINICONDA_VERSION, conda_version: str = CONDA_VERSION, tos_plugin: bool = False
) -> bytes:
    """The installer double; ``tos_plugin``: its conda has ``conda tos`` (Miniconda >= 25.5.1)."""
    t = Tree()
    conda = fill(
        doubles.source("conda.py"),
        CONDA_VERSION=conda_version,
        TOS_PLUGIN="yes" if tos_plugin else "no",
    )
    t.file("conda.py", conda, 0o755)
    t.file("conda.sh", doubles.source("conda.sh"))
    payload = t.tar_bytes()
    header = fill(
        doubles.source("miniconda-installer.sh"),
        MC_VERSION=version,
        CONDA_VERSION=conda_version,
    )
    header = header.replace("@SKIP@", str(header.count("\n") + 1))
    return header.encode() + payload
