"""System-layer facts: artifact cache, filesystems, CUDA, cuDNN, gcc, nouveau/initramfs files.

Free space and kernel headers are host facts (``facts.host.FreeSpace``, ``KernelHeaders``).

Like the GPU facts, every command exits 0 on any host and encodes what it saw in its output,
so gathering a fact never fails a host; a missing thing is ``None`` / ``False`` / empty.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase
from typing_extensions import override

__all__ = [
    "ArtifactFile",
    "ArtifactState",
    "CudaInstall",
    "CudaToolkit",
    "CudnnFile",
    "CudnnExtracted",
    "CudnnFiles",
    "CudnnHeaderVersion",
    "FileStamp",
    "FileStampFact",
    "GccMajor",
    "InitramfsMtime",
    "NvccRelease",
    "PathDevice",
    "cudnn_marker_path",
    "marker_path",
    "unsafe_owner",
]


def _q(path: str) -> str:
    return shlex.quote(path)


def _existing_ancestor(path: str) -> str:
    """Shell snippet: set ``$p`` to ``path`` or its nearest existing ancestor."""
    return f'p={_q(path)}; while [ ! -e "$p" ] && [ "$p" != / ]; do p=$(dirname "$p"); done; '


def _int_or_none(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


# ------------------------------------------------------------------------------------------
# Filesystems
# ------------------------------------------------------------------------------------------


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


# ------------------------------------------------------------------------------------------
# Artifact cache
# ------------------------------------------------------------------------------------------


def marker_path(path: str) -> str:
    """The verified marker kept next to a downloaded artifact: ``FILE.verified``."""
    return f"{path}.verified"


def unsafe_owner(uid: int | None, mode: int | None, writable_by: int = 0o022) -> str | None:
    """Why a path root trusts is not safe (``owned by uid 1000``, ``mode 0777``), or ``None``.

    ``writable_by`` is the mode bits that must be clear: group and others for files, others
    for the cache dir.
    """
    if uid is None or mode is None:
        return "owner and mode unknown"
    if uid != 0:
        return f"owned by uid {uid}, not root"
    if mode & writable_by:
        who = "group or others" if writable_by & 0o020 else "others"
        return f"mode {mode:04o} (writable by {who})"
    return None


@dataclass(frozen=True)
class ArtifactFile:
    """A cached artifact and its marker line ``SIZE MTIME SHA256`` (from the last check).

    Also the owner (uid) and mode of the file, the marker and the cache dir: root runs these
    files, so one that another account could have written is never trusted on its marker (the
    defaults describe a root-owned cache; the fact fills them from ``stat``).
    """

    size: int | None = None
    mtime: int | None = None
    marker_size: int | None = None
    marker_mtime: int | None = None
    marker_sha256: str | None = None
    uid: int | None = 0
    mode: int | None = 0o644
    marker_uid: int | None = 0
    marker_mode: int | None = 0o644
    dir_uid: int | None = 0
    dir_mode: int | None = 0o755
    dir_present: bool = True

    @property
    def present(self) -> bool:
        return self.size is not None

    @property
    def dir_problem(self) -> str | None:
        """Why the cache dir must not be used (not root's, or world-writable), or ``None``."""
        if not self.dir_present:
            return None
        return unsafe_owner(self.dir_uid, self.dir_mode, writable_by=0o002)

    @property
    def untrusted(self) -> str | None:
        """Why the marker cannot be believed without hashing (owner/mode), or ``None``."""
        for what, uid, mode, bits in (
            ("the cache dir", self.dir_uid, self.dir_mode, 0o002),
            ("the file", self.uid, self.mode, 0o022),
            ("its marker", self.marker_uid, self.marker_mode, 0o022),
        ):
            why = unsafe_owner(uid, mode, writable_by=bits)
            if why:
                return f"{what} is {why}"
        return None

    def verified(self, sha256: str) -> bool:
        """True when the marker was written for this very file (size, mtime) and this sum,
        and nobody but root could have written the file, the marker or the dir."""
        return (
            self.present
            and self.marker_sha256 == sha256.lower()
            and self.marker_size == self.size
            and self.marker_mtime == self.mtime
            and self.untrusted is None
        )


def _octal_or_none(text: str) -> int | None:
    return int(text, 8) if re.fullmatch(r"[0-7]{1,4}", text) else None


class ArtifactState(FactBase[ArtifactFile]):
    """
    Returns an ``ArtifactFile`` for ``path``: size, mtime, owner and mode of the file, the
    marker's content, owner and mode, and the owner and mode of the directory.

    Never hashes anything: a re-run compares size + mtime with the marker only.
    """

    @staticmethod
    @override
    def default() -> ArtifactFile:
        return ArtifactFile()

    @override
    def command(self, path: str) -> str:
        f, m = _q(path), _q(marker_path(path))
        d = _q(posixpath.dirname(path.rstrip("/")) or "/")
        return (
            f"if [ -d {d} ]; then echo \"dir $(stat -c '%u %a' {d})\"; fi; "
            f"if [ -f {f} ]; then echo \"file $(stat -c '%s %Y %u %a' {f})\"; fi; "
            f"if [ -f {m} ]; then echo \"markerstat $(stat -c '%u %a' {m})\"; "
            f'echo "marker $(head -c 200 {m})"; fi; true'
        )

    @override
    def process(self, output: list[str]) -> ArtifactFile:
        values: dict[str, int | str | bool | None] = {
            "uid": None, "mode": None, "marker_uid": None, "marker_mode": None,
            "dir_uid": None, "dir_mode": None, "dir_present": False,
        }  # fmt: skip
        for line in output:
            words = line.split()
            if len(words) == 3 and words[0] == "dir":
                values["dir_present"] = True
                values["dir_uid"], values["dir_mode"] = (
                    _int_or_none(words[1]),
                    _octal_or_none(words[2]),
                )
            elif len(words) in (3, 5) and words[0] == "file":
                values["size"], values["mtime"] = _int_or_none(words[1]), _int_or_none(words[2])
                if len(words) == 5:
                    values["uid"], values["mode"] = _int_or_none(words[3]), _octal_or_none(words[4])
            elif len(words) == 3 and words[0] == "markerstat":
                values["marker_uid"] = _int_or_none(words[1])
                values["marker_mode"] = _octal_or_none(words[2])
            elif len(words) == 4 and words[0] == "marker":
                values["marker_size"] = _int_or_none(words[1])
                values["marker_mtime"] = _int_or_none(words[2])
                if re.fullmatch(r"[0-9a-fA-F]{64}", words[3]):
                    values["marker_sha256"] = words[3].lower()
        return ArtifactFile(**values)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------
# Plain files with their mtime (nouveau blacklist) and the initramfs
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileStamp:
    mtime: int
    text: str


class FileStampFact(FactBase[FileStamp | None]):
    """Returns a small text file's mtime and content (``FileStamp``), or ``None`` if absent."""

    @override
    def command(self, path: str) -> str:
        f = _q(path)
        return f"if [ -f {f} ]; then stat -c %Y {f}; head -c 65536 {f}; fi; true"

    @override
    def process(self, output: list[str]) -> FileStamp | None:
        if not output or _int_or_none(output[0]) is None:
            return None
        text = "\n".join(output[1:])
        return FileStamp(mtime=int(output[0]), text=text + "\n" if text else "")


class InitramfsMtime(FactBase[int | None]):
    """
    Returns the mtime of the running kernel's initramfs (``/boot/initrd.img-$(uname -r)``),
    else of the newest ``/boot/initrd.img-*``; ``None`` when there is none.
    """

    @override
    def command(self, boot_dir: str = "/boot") -> str:
        b = _q(boot_dir)
        return (
            f'f={b}/initrd.img-"$(uname -r)"; '
            f'if [ -f "$f" ]; then stat -c %Y "$f"; '
            f"else ls -t {b}/initrd.img-* 2>/dev/null | head -n1 | "
            'while read -r g; do stat -c %Y "$g"; done; fi; true'
        )

    @override
    def process(self, output: list[str]) -> int | None:
        return _int_or_none(output[0]) if output else None


# ------------------------------------------------------------------------------------------
# Build tools: gcc (kernel headers and free space: facts.host)
# ------------------------------------------------------------------------------------------


class GccMajor(FactBase[int | None]):
    """Returns the major version of ``gcc`` (``gcc -dumpversion``), or ``None`` without gcc."""

    @override
    def command(self) -> str:
        return "gcc -dumpversion 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> int | None:
        match = re.match(r"(\d+)", output[0].strip()) if output else None
        return int(match.group(1)) if match else None


# ------------------------------------------------------------------------------------------
# CUDA
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CudaInstall:
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


# ------------------------------------------------------------------------------------------
# cuDNN
# ------------------------------------------------------------------------------------------


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
class CudnnFile:
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
