"""Checked downloads: bytes reach their destination only once their sha256 is the pinned one."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

CHUNK = 1 << 20
USER_AGENT = "p40fleet-mirror/1"


class FetchError(RuntimeError):
    """A download failed or its bytes are not the pinned ones (the message names URL and fix)."""


class SumMismatch(FetchError):
    """The downloaded bytes are not the pinned ones: ``got`` is their digest, ``want`` the pin
    (of ``algorithm``)."""

    def __init__(self, message: str, algorithm: str, got: str, want: str) -> None:
        super().__init__(message)
        self.algorithm, self.got, self.want = algorithm, got, want


def sha256_of(path: Path) -> str:
    return digest_of(path, "sha256")


def digest_of(path: Path, algorithm: str) -> str:
    """The hex digest of the file at ``path`` (``sha256``, or ``md5`` for a conda lock line
    that has only its md5)."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _progress_printer(name: str) -> Callable[[int, int | None], None]:
    last = [0.0]

    def show(done: int, total: int | None) -> None:
        now = time.monotonic()
        if now - last[0] < 2 and (total is None or done < total):
            return
        last[0] = now
        of = f"/{total / 1e6:.1f}" if total else ""
        print(f"  {name}: {done / 1e6:.1f}{of} MB", file=sys.stderr, flush=True)

    return show


def fetch(
    url: str,
    dest: Path,
    sha256: str | None,
    *,
    md5: str | None = None,
    size: int | None = None,
    timeout: float = 60.0,
    progress: bool = True,
) -> int:
    """Download ``url`` to ``dest`` (via ``dest.part``, resumed with a Range request when the
    server honours it, fetched whole again when it does not) and move it into place only when
    its sha256 is ``sha256`` (and its md5 ``md5``, when given: a conda lock line may have only
    that; one of the two is required). Returns the bytes transferred; raises
    :class:`FetchError`."""
    if not (sha256 or md5):
        raise FetchError(f"{url}: no sum to check it against: not fetched")
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    show = _progress_printer(dest.name) if progress else (lambda done, total: None)
    if urlsplit(url).scheme in ("", "file"):
        source = Path(urlsplit(url).path if "://" in url else url)
        try:
            shutil.copyfile(source, part)
        except OSError as exc:
            raise FetchError(f"{url}: cannot read it ({exc.strerror})") from None
        moved = part.stat().st_size
    else:
        moved = _http(url, part, size, timeout, show)
    for algorithm, want in (("sha256", sha256), ("md5", md5)):
        got = digest_of(part, algorithm) if want else None
        if got is not None and got != want:
            part.unlink(missing_ok=True)
            raise SumMismatch(
                f"{url}: {algorithm} {got} is not the pinned {want}: not kept (the upstream "
                "file changed, or the pin is wrong: check the pin against the publisher's sum)",
                algorithm,
                got,
                want,
            )
    os.replace(part, dest)
    return moved


def _http(url: str, part: Path, size: int | None, timeout: float, show) -> int:
    have = part.stat().st_size if part.exists() else 0
    if size is not None and have > size:  # longer than the file: nothing to resume
        part.unlink()
        have = 0
    headers = {"User-Agent": USER_AGENT}
    if have:
        headers["Range"] = f"bytes={have}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 - http(s) only
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # the .part is no prefix the server knows: start again
            part.unlink()
            return _http(url, part, size, timeout, show)
        raise FetchError(f"{url} answered HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise FetchError(f"{url}: cannot connect ({reason})") from None
    with response:
        resumed = have and response.status == 206
        mode = "ab" if resumed else "wb"
        done = have if resumed else 0
        length = response.headers.get("Content-Length")
        total = (done + int(length)) if length and length.isdigit() else size
        moved = 0
        with open(part, mode) as out:
            while True:
                try:
                    chunk = response.read(CHUNK)
                except OSError as exc:
                    raise FetchError(f"{url}: cut off after {done} bytes ({exc}); run the "
                                     "build again to resume") from None  # fmt: skip
                if not chunk:
                    break
                out.write(chunk)
                done += len(chunk)
                moved += len(chunk)
                if size is not None and done > size:
                    raise FetchError(f"{url}: more than the pinned {size} bytes: not kept")
                show(done, total)
    return moved
