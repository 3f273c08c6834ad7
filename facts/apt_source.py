"""What apt reads on a host: the mirror's source file, its key, and every other source.

One fact, ``AptSources``, read by ``operations.apt_source.mirror`` before any apt install, so
the operation decides from what is there (a second run changes nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from p40fleet.jsonable import ToJson

__all__ = ["APT_DIR", "MIRROR_KEY_DIR", "MIRROR_LIST", "AptSourceState", "AptSources"]

APT_DIR = "/etc/apt"
#: The one file the deploy owns in sources.list.d.
MIRROR_LIST = f"{APT_DIR}/sources.list.d/p40fleet-mirror.list"
#: Where the mirror's ``signed-by`` key goes (Debian's place for local keyrings).
MIRROR_KEY_DIR = f"{APT_DIR}/keyrings"

_MARK = "##p40fleet-apt"


@dataclass(frozen=True)
class AptSourceState(ToJson):
    """``mirror_list``: text of MIRROR_LIST (None = absent); ``key_sha256``: of the key file
    asked about (None = absent or none asked); ``others``: other source files that name a
    repository (``sources.list``, ``*.list``, ``*.sources``)."""

    mirror_list: str | None = None
    key_sha256: str | None = None
    others: tuple[str, ...] = ()


class AptSources(FactBase[AptSourceState]):
    """
    Returns an ``AptSourceState``: the mirror's list file, the sha256 of ``key_path`` and the
    other source files that still name a repository (a file with only comments does not).
    """

    @staticmethod
    @override
    def default() -> AptSourceState:
        return AptSourceState()

    @override
    def command(self, key_path: str | None = None) -> StringCommand:
        key = QuoteString(key_path or "/nonexistent")
        return StringCommand(
            f"echo '{_MARK} list'; head -c 65536 {MIRROR_LIST} 2>/dev/null;",
            f"echo '{_MARK} key';",
            "sha256sum",
            key,
            "2>/dev/null | cut -d' ' -f1;",
            f"echo '{_MARK} others';",
            f"for f in {APT_DIR}/sources.list {APT_DIR}/sources.list.d/*.list",
            f"{APT_DIR}/sources.list.d/*.sources; do",
            f'[ -f "$f" ] && [ "$f" != {MIRROR_LIST} ] &&',
            'grep -Eq \'^[[:space:]]*(deb|deb-src|Types:)[[:space:]]\' "$f" && echo "$f";',
            "done; true",
        )

    @override
    def process(self, output: list[str]) -> AptSourceState:
        parts: dict[str, list[str]] = {}
        current = None
        for line in output:
            if line.startswith(_MARK + " "):
                current = line[len(_MARK) + 1 :].strip()
                parts[current] = []
            elif current is not None:
                parts[current].append(line)
        listed = parts.get("list") or []
        key = "".join(parts.get("key") or []).strip()
        return AptSourceState(
            mirror_list="\n".join(listed) + "\n" if listed else None,
            key_sha256=key or None,
            others=tuple(line.strip() for line in parts.get("others") or [] if line.strip()),
        )
