"""What apt reads on a host: the mirror's source file, its key, and every other source.

One fact, ``AptSources``, read by ``operations.apt_source.mirror`` before any apt install, so
the operation decides from what is there (a second run changes nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from p40fleet.jsonable import ToJson

__all__ = [
    "APT_DIR", "ASIDE_DIR", "MIRROR_KEY_DIR", "MIRROR_LIST", "AptSourceState", "AptSources",
    "aside_origin",
]  # fmt: skip

APT_DIR = "/etc/apt"
#: Where an air-gapped host's own source files are moved, each under its path relative to
#: APT_DIR (``sources.list``, ``sources.list.d/cuda.list``); outside sources.list.d: apt
#: ignores it.
ASIDE_DIR = f"{APT_DIR}/p40fleet-aside"
#: The one file the deploy owns in sources.list.d.
MIRROR_LIST = f"{APT_DIR}/sources.list.d/p40fleet-mirror.list"
#: Where the mirror's ``signed-by`` key goes (Debian's place for local keyrings).
MIRROR_KEY_DIR = f"{APT_DIR}/keyrings"

_MARK = "##p40fleet-apt"


@dataclass(frozen=True)
class AptSourceState(ToJson):
    """``mirror_list``: text of MIRROR_LIST (None = absent); ``key_sha256``: of the key file
    asked about (None = absent or none asked); ``others``: other source files that name a
    repository (``sources.list``, ``*.list``, ``*.sources``); ``aside``: the source files in
    ASIDE_DIR, relative to it, each with ``True`` when its origin (:func:`aside_origin`) is
    free to restore it to (nothing there)."""

    mirror_list: str | None = None
    key_sha256: str | None = None
    others: tuple[str, ...] = ()
    aside: tuple[tuple[str, bool], ...] = ()


def aside_origin(relative: str) -> str:
    """Where a file in ASIDE_DIR came from: ``sources.list`` and ``sources.list.d/X`` keep
    their path; a bare ``X.list`` (the flat layout of earlier versions) was in sources.list.d."""
    if relative == "sources.list" or relative.startswith("sources.list.d/"):
        return f"{APT_DIR}/{relative}"
    return f"{APT_DIR}/sources.list.d/{relative}"


class AptSources(FactBase[AptSourceState]):
    """
    Returns an ``AptSourceState``: the mirror's list file, the sha256 of ``key_path``, the
    other source files that still name a repository (a file with only comments does not) and
    the source files moved aside (air-gapped) with whether their origin is free.
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
            "done;",
            f"echo '{_MARK} aside';",
            f"for f in {ASIDE_DIR}/*.list {ASIDE_DIR}/*.sources",
            f"{ASIDE_DIR}/sources.list.d/*.list {ASIDE_DIR}/sources.list.d/*.sources; do",
            '[ -f "$f" ] || continue; r=${f#' + ASIDE_DIR + "/};",
            'case "$r" in sources.list|sources.list.d/*) o=' + APT_DIR + "/$r;;",
            "*) o=" + APT_DIR + "/sources.list.d/$r;; esac;",
            'if [ -e "$o" ] || [ -L "$o" ]; then echo "taken $r"; else echo "free $r"; fi;',
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
            aside=tuple(
                (rel, kind == "free")
                for kind, _, rel in (line.strip().partition(" ") for line in parts.get("aside", []))
                if kind in ("free", "taken") and rel
            ),
        )
