"""CUDA facts: the toolkit dir, nvcc's release, and gcc (CUDA caps the gcc major it accepts).

Kernel headers and free space are host facts (``facts.host.KernelHeaders``, ``FreeSpace``).

Like every fact here, the command exits 0 on any host and encodes what it saw in its output,
so gathering a fact never fails a host; a missing thing is ``None`` / ``False`` / empty.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase
from typing_extensions import override

from p40fleet.jsonable import ToJson

__all__ = [
    "CudaInstall",
    "CudaToolkit",
    "GccMajor",
    "NvccRelease",
]


def _q(path: str) -> str:
    return shlex.quote(path)


class GccMajor(FactBase[int | None]):
    """Returns the major version of ``gcc`` (``gcc -dumpversion``), or ``None`` without gcc."""

    @override
    def command(self) -> str:
        return "gcc -dumpversion 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> int | None:
        match = re.match(r"(\d+)", output[0].strip()) if output else None
        return int(match.group(1)) if match else None


@dataclass(frozen=True)
class CudaInstall(ToJson):
    """What a CUDA toolkit dir holds: ``version.json``'s cuda version and whether nvcc is there."""

    exists: bool = False
    version: str | None = None
    nvcc: bool = False


class CudaToolkit(FactBase[CudaInstall]):
    """
    Returns a ``CudaInstall`` for ``cuda_dir``. ``version`` is ``version.json``'s
    ``cuda.version`` (``11.8.20220929``); a tree left by a killed install has none.
    """

    @staticmethod
    @override
    def default() -> CudaInstall:
        return CudaInstall()

    @override
    def command(self, cuda_dir: str) -> str:
        d = _q(cuda_dir)
        return (
            f"if [ -d {d} ]; then echo '##dir'; "
            f"if [ -x {d}/bin/nvcc ]; then echo '##nvcc'; fi; "
            f"if [ -f {d}/version.json ]; then echo '##json'; head -c 65536 {d}/version.json; fi; "
            "fi; true"
        )

    @override
    def process(self, output: list[str]) -> CudaInstall:
        exists = "##dir" in output
        nvcc = "##nvcc" in output
        version = None
        if "##json" in output:
            text = "\n".join(output[output.index("##json") + 1 :])
            try:
                data = json.loads(text)
                version = str(data["cuda"]["version"])
            except (ValueError, KeyError, TypeError):
                version = None
        return CudaInstall(exists=exists, version=version, nvcc=nvcc)


class NvccRelease(FactBase[str | None]):
    """Returns nvcc's full version (``11.8.89`` from ``release 11.8, V11.8.89``), or ``None``."""

    @override
    def command(self, cuda_dir: str) -> str:
        return f"{_q(cuda_dir.rstrip('/') + '/bin/nvcc')} --version 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> str | None:
        for line in output:
            match = re.search(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)", line)
            if match:
                return match.group(2)
        return None
