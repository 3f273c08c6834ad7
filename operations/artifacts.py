"""Download an artifact into the host cache, verified by sha256 before it gets its real name.

On the host, for ``/var/cache/p40fleet/X.run``::

    X.run.part       the download in progress (deleted on a sum mismatch)
    X.run            renamed from .part only after its sha256 matched
    X.run.verified   marker ``SIZE MTIME SHA256``: a re-run compares size + mtime, never re-hashes

A file already there without a valid marker (copied in by hand, touched) is hashed once: kept
if its sum matches, downloaded again if not.
"""

from __future__ import annotations

import posixpath

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from facts.host import FreeSpace
from facts.system import ArtifactState, marker_path
from operations.preflight import refuse
from p40fleet.spec import StackSpec

__all__ = ["artifact", "artifact_path", "fetch", "format_bytes"]


def format_bytes(count: int) -> str:
    """``4336730777`` -> ``4.34 GB (4336730777 bytes)``."""
    return f"{count / 1e9:.2f} GB ({count} bytes)"


def artifact_path(spec: StackSpec, name: str) -> str:
    """Where artifact ``name`` lives on the host (the spec's artifact cache)."""
    return posixpath.join(spec.paths.artifact_cache, spec.artifact(name).filename)


def _download_script(url: str, part: str, sha256: str, filename: str) -> StringCommand:
    """curl (or wget) to ``part``, then compare sums; on mismatch delete it and explain."""
    q_url, q_part = QuoteString(url), QuoteString(part)
    mismatch = printf_line(
        f"sha256 mismatch for {filename} (from {url}): expected {sha256}, got ",
        StringCommand('"$got"'),
        f"; the partial download was deleted. Remedy: check the mirror's copy of {filename} "
        "(sha256sum it there) or correct the sha256 in the stack spec, then re-run",
    )
    return StringCommand(
        "rm -f",
        q_part,
        "&& if command -v curl >/dev/null 2>&1; then curl -fsSL --retry 3 -o",
        q_part,
        q_url,
        "; else wget -q --tries=3 -O",
        q_part,
        q_url,
        "; fi && got=$(sha256sum",
        q_part,
        "| cut -d' ' -f1) && if [ \"$got\" != ",
        QuoteString(sha256),
        "]; then rm -f",
        q_part,
        ";",
        mismatch,
        ">&2; exit 1; fi",
    )


def printf_line(*parts: str | StringCommand) -> StringCommand:
    """``printf`` of ``parts`` and a newline: text parts are single-quoted (never parsed by the
    shell, whatever a URL or file name holds); a StringCommand part (``'"$got"'``) goes as is."""
    words = [p if isinstance(p, StringCommand) else QuoteString(p) for p in parts]
    return StringCommand("printf", "'" + "%s" * len(parts) + "\\n'", *words)


def _marker_command(path: str, sha256: str) -> StringCommand:
    """Write ``SIZE MTIME SHA256`` of ``path`` to its marker (via a temp name)."""
    marker = marker_path(path)
    return StringCommand(
        "echo \"$(stat -c '%s %Y'",
        QuoteString(path),
        f') {sha256}" >',
        QuoteString(marker + ".tmp"),
        "&& mv -f",
        QuoteString(marker + ".tmp"),
        QuoteString(marker),
    )


@operation()
def fetch(
    url: str,
    sha256: str,
    dest_dir: str,
    filename: str | None = None,
    size: int | None = None,
):
    """
    Download ``url`` into ``dest_dir`` and keep it only if its sha256 matches.

    + url: where to download from (mirror or upstream)
    + sha256: expected sum (64 hex)
    + dest_dir: the host's artifact cache (created if missing)
    + filename: file name in the cache (default: last part of the URL)
    + size: expected size in bytes, if known: free space is checked before downloading
    """
    sha256 = sha256.lower()
    filename = filename or posixpath.basename(url.split("?", 1)[0])
    path = posixpath.join(dest_dir, filename)
    part = f"{path}.part"
    state = host.get_fact(ArtifactState, path=path)

    if state.verified(sha256):
        host.noop(f"{filename} is in {dest_dir}, verified (sha256 {sha256[:12]}…)")
        return

    if size is not None and not state.present:
        space = host.get_fact(FreeSpace, path=dest_dir)
        free = space.available_bytes if space else None
        if free is not None and free < size:
            yield from refuse._inner(
                step=f"download {filename}",
                reason=(
                    f"not enough free space for {filename} in {dest_dir}: needs "
                    f"{format_bytes(size)}, {format_bytes(free)} free, "
                    f"{format_bytes(size - free)} missing"
                ),
                remedy=(
                    f"free {format_bytes(size - free)} on the filesystem of {dest_dir} or set "
                    "stack.paths.artifact_cache to a directory on a filesystem with room"
                ),
            )
            return

    yield StringCommand("mkdir -p", QuoteString(dest_dir))
    if state.present:
        # There without a valid marker: hash it once, keep it if it matches, else fetch again.
        host.log(f"{filename}: no valid verified marker, checking its sha256 once")
        yield StringCommand(
            'if [ "$(sha256sum',
            QuoteString(path),
            "| cut -d' ' -f1)\" != ",
            QuoteString(sha256),
            "]; then rm -f",
            QuoteString(path),
            "&&",
            _download_script(url, part, sha256, filename),
            "&& mv -f",
            QuoteString(part),
            QuoteString(path),
            "; fi",
        )
    else:
        yield _download_script(url, part, sha256, filename)
        yield StringCommand("mv -f", QuoteString(part), QuoteString(path))
    yield _marker_command(path, sha256)


@operation()
def artifact(item: str, spec: StackSpec):
    """
    Fetch the spec's artifact ``item`` (``driver``, ``cuda``, ``cudnn``, ``miniconda``).

    + item: the artifact's field in the stack spec (not ``name``: pyinfra takes that one)
    + spec: the host's StackSpec (mirror URL when it names one, else upstream)
    """
    what = spec.artifact(item)
    url = spec.artifact_url(item)
    yield from fetch._inner(
        url=url,
        sha256=what.sha256,
        dest_dir=spec.paths.artifact_cache,
        filename=what.filename,
        size=what.size,
    )
