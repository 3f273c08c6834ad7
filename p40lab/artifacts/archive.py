"""Deterministic archives: an in-memory file tree to tar, and makeself-style installers."""

from __future__ import annotations

import gzip
import hashlib
import io
import lzma
import tarfile
from email.utils import formatdate
from typing import Any

from p40lab import doubles

FIXED_MTIME = 1700000000  # 2023-11-14: deterministic archives


def fill(template: str, **values: Any) -> str:
    for k, v in values.items():
        template = template.replace(f"@{k}@", str(v))
    return template


class Tree:
    """An in-memory file tree -> deterministic tar (sorted, fixed mtime, root-owned)."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[str, bytes | str, int]] = {}

    def file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self.entries[path] = ("f", data.encode() if isinstance(data, str) else data, mode)

    def link(self, path: str, target: str) -> None:
        self.entries[path] = ("l", target, 0o777)

    def files(self) -> list[str]:
        return sorted(self.entries)

    def tar_bytes(self, top: str = "", compress: str = "gz") -> bytes:
        raw = io.BytesIO()
        dirs: set[str] = set()
        for p in self.entries:
            parts = (f"{top}/{p}" if top else p).split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
            items = [(d, None) for d in dirs] + [
                (f"{top}/{p}" if top else p, e) for p, e in self.entries.items()
            ]
            for name, e in sorted(items, key=lambda x: x[0]):
                ti = tarfile.TarInfo(name)
                ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = FIXED_MTIME, 0, 0, "root", "root"
                if e is None:
                    ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(ti)
                elif e[0] == "l":
                    ti.type, ti.linkname, ti.mode = tarfile.SYMTYPE, e[1], 0o777
                    tar.addfile(ti)
                else:
                    ti.size, ti.mode = len(e[1]), e[2]
                    tar.addfile(ti, io.BytesIO(e[1]))
        data = raw.getvalue()
        if compress == "gz":
            out = io.BytesIO()
            with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=6) as gz:
                gz.write(data)
            return out.getvalue()
        if compress == "xz":
            return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=6)
        return data

    def size_kb(self) -> int:
        return sum(len(e[1]) for e in self.entries.values() if e[0] == "f") // 1024 + 1


def makeself(
    tree: Tree,
    *,
    label: str,
    script: str,
    targetname: str,
    req_bytes: int = 0,
    req_env: str = "",
) -> bytes:
    payload = tree.tar_bytes()
    header = fill(
        doubles.source("makeself-header.sh"),
        LABEL=label,
        SCRIPT=script,
        TARGETNAME=targetname,
        MD5=hashlib.md5(payload).hexdigest(),
        USIZE_KB=tree.size_kb(),
        REQ_BYTES=req_bytes,
        REQ_ENV=req_env,
        DATE=formatdate(FIXED_MTIME, usegmt=True),
    )
    skip = header.count("\n") + 1
    header = header.replace("@SKIP@", str(skip))
    return header.encode() + payload
