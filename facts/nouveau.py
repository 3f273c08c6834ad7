"""nouveau facts: whether the module is loaded, the blacklist file and the initramfs it needs.

Like every fact here, the command exits 0 on any host and encodes what it saw in its output,
so gathering a fact never fails a host; a missing thing is ``None`` / ``False`` / empty.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase
from typing_extensions import override

from p40fleet.jsonable import ToJson

__all__ = [
    "FileStamp",
    "FileStampFact",
    "InitramfsMtime",
    "NouveauLoaded",
]


def _q(path: str) -> str:
    return shlex.quote(path)


def _int_or_none(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


@dataclass(frozen=True)
class FileStamp(ToJson):
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


class NouveauLoaded(FactBase[bool]):
    """Returns whether the nouveau kernel module is loaded (``/sys/module/nouveau``)."""

    @override
    def command(self) -> str:
        return "if [ -d /sys/module/nouveau ]; then echo yes; else echo no; fi"

    @override
    def process(self, output: list[str]) -> bool:
        return any(line.strip() == "yes" for line in output)
