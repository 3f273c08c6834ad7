"""Facts about the places artifacts come from: does a URL answer, and with what size."""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import FactBase, QuoteString, StringCommand


@dataclass(frozen=True)
class UrlAnswer:
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
    """

    def command(self, url: str, proxy: str = "") -> StringCommand:
        """``proxy``: shell that sets the proxy variables (``p40fleet.proxy.shell_prefix``)."""
        return StringCommand(
            *([proxy] if proxy else []),
            "if command -v curl >/dev/null 2>&1; then",
            "curl -sS -I -L --max-time 10 -o /dev/null",
            "-w 'status=%{http_code} size=%{size_download} length=%header{content-length}\\n'",
            QuoteString(url),
            "2>&1 || true; else echo 'error=curl is not installed'; fi",
        )

    def process(self, output: list[str]) -> UrlAnswer | None:
        status, size, errors = 0, None, []
        for line in output:
            if line.startswith("status="):
                fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
                status = int(fields.get("status", "0") or 0)
                length = fields.get("length", "").strip()
                size = int(length) if length.isdigit() else None
            else:
                errors.append(line.removeprefix("error=").strip())
        return UrlAnswer(url="", status=status, size=size, error="; ".join(e for e in errors if e))
