"""The p40fleet run lock as the host has it: its holder file and the host's boot_id.

Exits 0 on any host; a missing lock is ``exists=False`` (see ``p40fleet.run_lock``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase
from typing_extensions import override

from p40fleet.jsonable import ToJson
from p40fleet.run_lock import BOOT_ID

__all__ = ["RunLock", "RunLockState"]


@dataclass(frozen=True)
class RunLockState(ToJson):
    """``exists``: the lock directory is there; ``text``: its holder file (4 KiB at most)."""

    exists: bool
    text: str
    boot_id: str


class RunLock(FactBase[RunLockState]):
    """
    Returns ``RunLockState`` for the lock directory ``path``: whether it exists, its holder
    file's text and the host's current boot_id.
    """

    @staticmethod
    @override
    def default() -> RunLockState:
        return RunLockState(False, "", "")

    @override
    def command(self, path: str) -> str:
        q = shlex.quote(path)
        return (
            f'echo "boot_id=$(cat {BOOT_ID} 2>/dev/null)"; '
            f"if [ -d {q} ]; then echo lock=present; "
            f"head -c 4096 {shlex.quote(path + '/holder')} 2>/dev/null; fi; true"
        )

    @override
    def process(self, output: list[str]) -> RunLockState:
        boot_id, exists, text = "", False, []
        for index, line in enumerate(output):
            if index == 0 and line.startswith("boot_id="):
                boot_id = line.split("=", 1)[1].strip()
            elif not exists and line == "lock=present":
                exists = True
            elif exists:
                text.append(line)
        return RunLockState(exists, "\n".join(text).strip("\n"), boot_id)
