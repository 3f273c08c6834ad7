"""Conda explicit locks (``files/conda-env-<variant>.txt``): one package URL per line, each with
its sum, after an ``@EXPLICIT`` line (what ``conda list --explicit --sha256`` writes).

``conda create -n NAME --file LOCK`` then installs exactly those files and nothing else: no
solver, no repodata, and conda checks each download against the line's sum
(``ChecksumMismatchError`` otherwise). A line's sum is ``#sha256:HEX`` (conda >= 24.9, CEP 23;
the pinned Miniconda's conda is 24.11.1) or ``#HEX`` of 32 digits (md5, any conda).

A lock names the packages by URL on the channel it was made from; a mirror channel
(``stack.mirror.conda_channel``) serves the same files under the same ``<subdir>/<file>``, so
:func:`render` moves every URL onto the channel in use. The sums stay: a mirror cannot change
what is installed, only fail to serve it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

__all__ = ["EXPLICIT", "LockedPackage", "digest", "load", "parse", "problems", "render"]

EXPLICIT = "@EXPLICIT"

# CEP 23's line grammar (conda's own ``url_pat``), with the channel and subdir split off.
_LINE = re.compile(
    r"^(?P<channel>[a-z][a-z0-9+.-]*://\S+?)/(?P<subdir>[a-z0-9_-]+)/"
    r"(?P<fn>[^/\\#\s]+(?:\.tar\.bz2|\.conda))"
    r"(?:#(?:(?P<md5>[0-9a-f]{32})|(?:sha256:)?(?P<sha256>[0-9a-f]{64})))?$"
)


@dataclass(frozen=True)
class LockedPackage:
    """One line of a lock: where the file is, its name parts and its sum."""

    channel: str  # e.g. https://conda.anaconda.org/conda-forge
    subdir: str  # linux-64 or noarch
    filename: str  # python-3.10.12-hd12c33a_0_cpython.conda
    md5: str | None
    sha256: str | None

    @property
    def url(self) -> str:
        return f"{self.channel}/{self.subdir}/{self.filename}"

    @property
    def dist(self) -> str:
        """``name-version-build`` (the file name without its extension)."""
        return self.filename.removesuffix(".conda").removesuffix(".tar.bz2")

    @property
    def name(self) -> str:
        return self.dist.rsplit("-", 2)[0]

    @property
    def version(self) -> str:
        return self.dist.rsplit("-", 2)[1]

    def line(self, channel: str | None = None) -> str:
        """The lock line, on ``channel`` when given (else its own)."""
        base = (channel or self.channel).rstrip("/")
        anchor = f"#sha256:{self.sha256}" if self.sha256 else f"#{self.md5}" if self.md5 else ""
        return f"{base}/{self.subdir}/{self.filename}{anchor}"


def _package_lines(text: str) -> tuple[bool, list[str]]:
    """(whether ``@EXPLICIT`` is there, the non-comment lines after it)."""
    seen, out = False, []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line == EXPLICIT:
            seen = True
            continue
        if seen:
            out.append(line)
    return seen, out


def parse(text: str) -> list[LockedPackage]:
    """The packages of a lock, in its order. Raises ``ValueError`` naming a line conda would
    not take (use :func:`problems` for every reason at once)."""
    found = problems(text)
    if found:
        raise ValueError("; ".join(found))
    return [_package(line) for line in _package_lines(text)[1]]


def _package(line: str) -> LockedPackage:
    m = _LINE.match(line)
    if m is None:
        raise ValueError(line)
    return LockedPackage(m["channel"], m["subdir"], m["fn"], m["md5"], m["sha256"])


def problems(text: str, python_version: str | None = None) -> list[str]:
    """What stops ``conda create --file`` of ``text`` from installing an env of exactly these
    files: no ``@EXPLICIT`` line, a line that is not a package URL, a line without a sum, a
    package named twice, no ``python`` at ``python_version`` (when given)."""
    explicit, lines = _package_lines(text)
    if not explicit:
        return [f"no {EXPLICIT} line (conda would solve the names instead of installing files)"]
    out: list[str] = []
    packages: list[LockedPackage] = []
    for line in lines:
        if _LINE.match(line) is None:
            out.append(f"{line!r} is not a package URL with #sha256:HEX or #MD5")
            continue
        package = _package(line)
        if not (package.sha256 or package.md5):
            out.append(f"{package.filename} has no sum (#sha256:HEX, or #MD5 from conda list "
                       "--explicit --md5)")  # fmt: skip
        packages.append(package)
    names = [p.name for p in packages]
    out += [f"{name} is named twice" for name in sorted({n for n in names if names.count(n) > 1})]
    if not packages:
        out.append("no package lines")
    if python_version is not None:
        pythons = [p.version for p in packages if p.name == "python"]
        if python_version not in pythons:
            have = f"python {', '.join(pythons)}" if pythons else "no python"
            out.append(f"the lock has {have}, the spec pins python {python_version}")
    return out


def render(text: str, channel: str | None = None) -> str:
    """The lock conda gets: ``@EXPLICIT`` and each package line on ``channel`` (the mirror's;
    None: the lock's own URLs), the header's comments kept. Raises ``ValueError`` as
    :func:`parse`."""
    packages = parse(text)
    header = []
    for raw in text.splitlines():
        if raw.strip() == EXPLICIT:
            break
        header.append(raw)
    body = [package.line(channel) for package in packages]
    return "\n".join([*header, EXPLICIT, *body]) + "\n"


def digest(text: str) -> str:
    """The sha256 of a rendered lock: what the env records it was made from."""
    return hashlib.sha256(text.encode()).hexdigest()


def load(path: str, python_version: str, channel: str | None = None) -> tuple[str, list[str]]:
    """The lock ``conda create --file`` gets from the file at ``path`` (its packages on
    ``channel``; None: the lock's own URLs) and what stops it (:func:`problems`; ``""`` then).
    One function for the preflight and the conda step, so both decide (and digest) alike."""
    try:
        with open(path) as handle:
            text = handle.read()
    except OSError as exc:  # e.g. stack.verl.requirements names a variant without a conda lock
        return "", [f"cannot read it ({exc.strerror})"]
    found = problems(text, python_version)
    return ("" if found else render(text, channel)), found
