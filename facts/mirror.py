"""The mirror's side on a host: what apt reads (the mirror's source file, its key, every
other source) and whether a URL the host downloads from answers.

``AptSources`` is read by ``operations.mirror.mirror`` before any apt install, so the
operation decides from what is there (a second run changes nothing); ``UrlHead`` by the
preflight (``p40fleet/deploys/steps/preflight.py``) before any download. The mirror itself is
built, checked and served by the package ``p40fleet.mirror`` (``python -m p40fleet.mirror``,
on the controller); this module and ``operations/mirror.py`` are the hosts' use of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from p40fleet.jsonable import ToJson

__all__ = [
    "APT_DIR", "ASIDE_DIR", "MIRROR_KEY_DIR", "MIRROR_LIST", "AptSourceState", "AptSources",
    "UrlAnswer", "UrlHead", "aside_origin",
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


@dataclass(frozen=True)
class UrlAnswer(ToJson):
    """What a ``HEAD`` request for a URL got: the HTTP status (0 = no answer) and the size."""

    url: str
    status: int
    size: int | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class UrlHead(FactBase[UrlAnswer | None]):
    """
    Returns a ``UrlAnswer`` for ``url`` seen from the host (the host downloads, not the
    controller). Never fails the host: no curl or no answer gives status 0 and the error.
    Status -1: not asked (the proxy's credentials are not on the host yet: a first run).

    The size is the last response's ``Content-Length`` from the header dump (``-D -``): focal's
    curl 7.68 has no ``%header{}`` write-out (7.84), so it is never asked for.
    """

    def command(self, url: str, proxy: str = "") -> StringCommand:
        """``proxy``: shell that sets the proxy variables (``p40fleet.proxy.shell_prefix``)."""
        return StringCommand(
            *([proxy] if proxy else []),
            "if command -v curl >/dev/null 2>&1; then",
            "curl -sS -I -L --max-time 10 -D - -o /dev/null",
            "-w 'status=%{http_code}\\n'",
            QuoteString(url),
            "2>&1 || true; else echo 'error=curl is not installed'; fi",
        )

    def process(self, output: list[str]) -> UrlAnswer | None:
        status, size, errors = 0, None, []
        in_headers, length = False, None
        for raw in output:
            line = raw.rstrip("\r\n")
            if line.startswith("HTTP/"):
                # a new response (a redirect's target follows its 3xx): only the last one counts
                in_headers, length = True, None
            elif in_headers and not line.strip():
                in_headers = False
            elif in_headers and ":" in line:
                name, value = line.split(":", 1)
                if name.strip().lower() == "content-length":
                    length = value.strip()
            elif line.startswith("status="):
                fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
                status = int(fields.get("status", "0") or 0)
                size = int(length) if length is not None and length.isdigit() else None
            elif line.strip():
                errors.append(line.removeprefix("error=").strip())
        return UrlAnswer(url="", status=status, size=size, error="; ".join(e for e in errors if e))
