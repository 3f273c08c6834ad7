"""The p40fleet run lock as the host has it: its holder file, the host's boot_id, its clock and
its uptime (the lock's age and a reboot's grace are measured on the host, not the controller).

Exits 0 on any host; a missing lock is ``exists=False`` (see ``p40fleet.run_lock``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import datetime, timezone

from pyinfra.api import FactBase
from typing_extensions import override

from p40fleet.jsonable import ToJson
from p40fleet.run_lock import BOOT_ID

__all__ = ["RunLock", "RunLockState"]


@dataclass(frozen=True)
class RunLockState(ToJson):
    """``exists``: the lock directory is there; ``text``: its holder file (4 KiB at most);
    ``now``: the host's clock (UTC; None if unreadable); ``uptime_s``: seconds since its boot."""

    exists: bool
    text: str
    boot_id: str
    now: datetime | None = None
    uptime_s: float | None = None


class RunLock(FactBase[RunLockState]):
    """
    Returns ``RunLockState`` for the lock directory ``path``: whether it exists, its holder
    file's text and the host's current boot_id, clock and uptime.
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
            'echo "now=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; '
            "echo \"uptime=$(cut -d' ' -f1 /proc/uptime 2>/dev/null)\"; "
            f"if [ -d {q} ]; then echo lock=present; "
            f"head -c 4096 {shlex.quote(path + '/holder')} 2>/dev/null; fi; true"
        )

    @override
    def process(self, output: list[str]) -> RunLockState:
        boot_id, exists, text = "", False, []
        now: datetime | None = None
        uptime: float | None = None
        for line in output:
            if exists:
                text.append(line)
            elif line == "lock=present":
                exists = True
            elif line.startswith("boot_id="):
                boot_id = line.split("=", 1)[1].strip()
            elif line.startswith("now="):
                try:
                    now = datetime.strptime(line[4:].strip(), "%Y-%m-%dT%H:%M:%SZ")
                    now = now.replace(tzinfo=timezone.utc)
                except ValueError:
                    now = None
            elif line.startswith("uptime="):
                try:
                    uptime = float(line[7:].strip())
                except ValueError:
                    uptime = None
        return RunLockState(exists, "\n".join(text).strip("\n"), boot_id, now, uptime)
