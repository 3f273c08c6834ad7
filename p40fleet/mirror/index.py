"""Finding a locked file on a PEP 503 index: the file whose ``#sha256=`` is the lock's."""

from __future__ import annotations

import html
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from p40fleet.mirror.fetch import USER_AGENT, FetchError

_ANCHOR = re.compile(r"<a\s[^>]*?href=\"([^\"]+)\"[^>]*>([^<]+)</a>", re.I)


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str  # without the #sha256= fragment
    sha256: str


def project_files(index_url: str, name: str, timeout: float = 60.0) -> list[IndexFile]:
    """The files of project ``name`` on the PEP 503 index ``index_url`` that carry a sha256."""
    page = f"{index_url.rstrip('/')}/{name}/"
    request = urllib.request.Request(page, headers={"User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            text = response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise FetchError(f"{page} answered HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise FetchError(f"{page}: cannot connect ({getattr(exc, 'reason', exc)})") from None
    found = []
    for href, label in _ANCHOR.findall(text):
        href = html.unescape(href)
        url, _, fragment = href.partition("#")
        if not fragment.startswith("sha256="):
            continue
        absolute = urljoin(page, url)
        filename = html.unescape(label).strip() or urlsplit(absolute).path.rsplit("/", 1)[-1]
        found.append(IndexFile(filename, absolute, fragment[len("sha256=") :].lower()))
    return found
