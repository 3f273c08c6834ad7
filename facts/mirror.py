"""Facts about the places artifacts come from: does a URL answer, and with what size."""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import FactBase, QuoteString, StringCommand

from p40fleet.jsonable import ToJson


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
