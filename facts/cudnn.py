"""cuDNN facts: the header's version, the unpacked tree's completion marker, the files linked
into the CUDA dir, and the filesystem they are on (hard links need one).

Like every fact here, the command exits 0 on any host and encodes what it saw in its output,
so gathering a fact never fails a host; a missing thing is ``None`` / ``False`` / empty.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase
from typing_extensions import override

from p40fleet.jsonable import ToJson

__all__ = [
    "CudnnExtracted",
    "CudnnFile",
    "CudnnFiles",
    "CudnnHeaderVersion",
    "PathDevice",
    "cudnn_marker_path",
]


def _q(path: str) -> str:
    return shlex.quote(path)


def _existing_ancestor(path: str) -> str:
    """Shell snippet: set ``$p`` to ``path`` or its nearest existing ancestor."""
    return f'p={_q(path)}; while [ ! -e "$p" ] && [ "$p" != / ]; do p=$(dirname "$p"); done; '


def _int_or_none(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


class PathDevice(FactBase[int | None]):
    """
    Returns the device number (``stat -c %d``) of ``path``, or of its nearest existing
    ancestor: two paths can hold hard links to each other only when these are equal.
    """

    @override
    def command(self, path: str) -> str:
        return _existing_ancestor(path) + 'stat -c %d "$p" 2>/dev/null || true'

    @override
    def process(self, output: list[str]) -> int | None:
        return _int_or_none(output[0]) if output else None


class CudnnHeaderVersion(FactBase[str | None]):
    """Returns ``MAJOR.MINOR.PATCH`` from a ``cudnn_version.h`` at ``path``, or ``None``."""

    @override
    def command(self, path: str) -> str:
        return f"grep -E '^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ' {_q(path)} 2>/dev/null; true"

    @override
    def process(self, output: list[str]) -> str | None:
        parts: dict[str, str] = {}
        for line in output:
            match = re.match(r"#define CUDNN_(MAJOR|MINOR|PATCHLEVEL)\s+(\d+)", line.strip())
            if match:
                parts[match.group(1)] = match.group(2)
        if len(parts) != 3:
            return None
        return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCHLEVEL']}"


def cudnn_marker_path(tree: str) -> str:
    """Completion marker of an unpacked cuDNN tree: written only after tar exited 0."""
    return posixpath.join(tree, ".p40fleet-extracted")


class CudnnExtracted(FactBase[str | None]):
    """Returns the archive sha256 recorded in a cuDNN tree's completion marker, or ``None``.

    ``None`` means the tree was never completely unpacked by this project (absent, interrupted,
    or unpacked by an older version that wrote no marker).
    """

    @override
    def command(self, tree: str) -> str:
        return f"head -c 200 {_q(cudnn_marker_path(tree))} 2>/dev/null; true"

    @override
    def process(self, output: list[str]) -> str | None:
        words = " ".join(output).split()
        if words and re.fullmatch(r"[0-9a-fA-F]{64}", words[0]):
            return words[0].lower()
        return None


@dataclass(frozen=True)
class CudnnFile(ToJson):
    """One cuDNN file (or symlink, not followed): where it is and which inode it is."""

    device: int
    inode: int
    symlink: bool


class CudnnFiles(FactBase[dict[str, dict[str, CudnnFile]]]):
    """
    Returns the cuDNN files of a source tree and of the CUDA dir, by relative path::

        {"src": {"include/cudnn.h": CudnnFile, "lib/libcudnn.so.8": ...},
         "dst": {"include/cudnn.h": ..., "lib64/libcudnn.so.8": ...}}

    ``src`` globs ``include/cudnn*.h`` and ``lib/libcudnn*`` under ``src_dir``, ``dst`` globs
    ``include/cudnn*.h`` and ``lib64/libcudnn*`` under ``cuda_dir`` (``lstat``: links are
    compared as themselves, the way ``cp -lP`` makes them).
    """

    @staticmethod
    @override
    def default() -> dict[str, dict[str, CudnnFile]]:
        return {"src": {}, "dst": {}}

    @override
    def command(self, src_dir: str, cuda_dir: str) -> str:
        s, c = _q(src_dir.rstrip("/")), _q(cuda_dir.rstrip("/"))
        return (
            f"for f in {s}/include/cudnn*.h {s}/lib/libcudnn*; do "
            '[ -e "$f" ] || [ -L "$f" ] || continue; '
            "echo \"src $(stat -c '%d %i %F' \"$f\" | tr ' ' _) ${f#" + s + '/}"; done; '
            f"for f in {c}/include/cudnn*.h {c}/lib64/libcudnn*; do "
            '[ -e "$f" ] || [ -L "$f" ] || continue; '
            "echo \"dst $(stat -c '%d %i %F' \"$f\" | tr ' ' _) ${f#" + c + '/}"; done; true'
        )

    @override
    def process(self, output: list[str]) -> dict[str, dict[str, CudnnFile]]:
        out: dict[str, dict[str, CudnnFile]] = {"src": {}, "dst": {}}
        for line in output:
            words = line.split(None, 2)
            if len(words) != 3 or words[0] not in out:
                continue
            stat = words[1].split("_", 2)
            if len(stat) < 3 or not stat[0].isdigit() or not stat[1].isdigit():
                continue
            out[words[0]][words[2]] = CudnnFile(
                device=int(stat[0]), inode=int(stat[1]), symlink="symbolic" in stat[2]
            )
        return out
