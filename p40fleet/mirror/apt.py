"""The mirror's apt repository: the packages the deploy installs and their dependencies, fetched
from an upstream repository (the Ubuntu archive for focal; dists-style, or flat: a suite ending in
``/``), each byte checked, and republished as a dists-style repository signed with the mirror's
own key (issue 27).

Chain of checks: the upstream ``Release`` is checked with ``gpgv`` against ``keyring`` when one
is given (else not: the build says so, and refuses a plain-http upstream unless told
``allow_unverified``); each ``Packages`` index against that Release's SHA256; each ``.deb``
against its index paragraph's SHA256 and Size. A flat upstream (Debian's "Flat Repository
Format", ``deb URL ./``: ``URL/Release`` and ``URL/Packages[.gz]``, no components) is read the
same way, except that its Release may list weaker sums: SHA256 is used when listed, an MD5Sum
only (or no sum) only with ``allow_unverified``; its .debs land under the mirror's ``pool/``
(their ``Filename`` is rewritten to match). The closure is resolved in Python
(:mod:`p40fleet.mirror.debian`, which says what it simplifies). Layout::

    DIR/apt/dists/SUITE/{Release,Release.gpg,InRelease}
    DIR/apt/dists/SUITE/main/binary-amd64/{Packages,Packages.gz}
    DIR/apt/pool/...                 the .debs, at the upstream's Filename paths (a flat
                                     upstream's under pool/)
    DIR/apt/p40fleet-mirror.gpg      the public key (stack.mirror.apt.signed_by)
    DIR/keys/                        the signing key (GNUPGHOME; never served)
    DIR/.cache/apt/SUITE/            the upstream Release and Packages last read
    DIR/.cache/apt-flat/DIR/         the same for a flat upstream (DIR: the suite, "" for ./)

How to use it, what is checked and what not, the numbers: docs/air-gapped-apt.md.

A second build reads the cached upstream indexes (``refresh`` reads them again) and fetches
only the .debs the mirror lacks; the index is re-signed only when its content changed.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import posixpath
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from urllib.parse import urlsplit

from p40fleet.mirror.debian import AptError, Package, paragraphs, release_hashes, release_sums
from p40fleet.mirror.fetch import USER_AGENT, FetchError, digest_of, fetch, sha256_of
from p40fleet.mirror.manifest import Entry, Manifest

#: The default upstream: Ubuntu 20.04's archive, where a focal host's packages come from;
#: headers of updated kernels are in -updates and -security, dkms in main.
UBUNTU_ARCHIVE = "http://archive.ubuntu.com/ubuntu"
FOCAL_SUITES = ("focal", "focal-updates", "focal-security")
FOCAL_COMPONENTS = ("main", "universe")
#: The mirror's suite when every upstream suite is flat (a flat repository has no suite name;
#: the hosts are Ubuntu 20.04).
FLAT_MIRROR_SUITE = "focal"
#: Ubuntu's archive key where a controller has it (package ubuntu-keyring).
UBUNTU_KEYRING = "/usr/share/keyrings/ubuntu-archive-keyring.gpg"
COMPONENT = "main"
KEY_FILE = "p40fleet-mirror.gpg"
KEY_UID = "p40fleet mirror <mirror@p40fleet.invalid>"
_INDEX_NAMES = (("Packages.xz", lzma.decompress), ("Packages.gz", gzip.decompress),
                ("Packages.bz2", bz2.decompress), ("Packages", bytes))  # fmt: skip


def flat_dir(suite: str) -> str | None:
    """The directory of a flat suite (``./`` or ``/``: "", ``sub/``: "sub"), None for a
    dists-style one; raises :class:`AptError` for a flat suite that leaves the repository."""
    if not suite.endswith("/"):
        return None
    if ".." in suite.split("/"):
        raise AptError(f"suite {suite!r}: a flat suite is a directory inside the upstream, "
                       "without '..'")  # fmt: skip
    return posixpath.normpath("/" + suite).strip("/")


@dataclass(frozen=True)
class Upstream:
    """Where the packages come from: a repository and which of its indexes (``components``
    apply to its dists-style suites only; a flat suite, ending in ``/``, has none)."""

    url: str = UBUNTU_ARCHIVE
    suites: tuple[str, ...] = FOCAL_SUITES
    components: tuple[str, ...] = FOCAL_COMPONENTS
    arch: str = "amd64"
    keyring: Path | None = None  # gpgv checks each Release.gpg against it when set
    allow_unverified: bool = False  # a plain-http upstream without a keyring

    @property
    def mirror_suite(self) -> str:
        """The suite the mirror publishes: the first dists-style one, else
        :data:`FLAT_MIRROR_SUITE`."""
        return next((s for s in self.suites if not s.endswith("/")), FLAT_MIRROR_SUITE)


def deploy_packages(kernels: Sequence[str]) -> list[str]:
    """What the deploy installs with apt: the driver build's packages (operations.driver) and
    ``linux-headers-RELEASE`` for each kernel release."""
    from p40fleet.footprint import BUILD_PACKAGES  # the one list operations.driver installs

    return [*BUILD_PACKAGES, *(f"linux-headers-{k}" for k in kernels)]


def _read(url: str, timeout: float = 60.0) -> bytes:
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        try:
            return Path(parts.path).read_bytes()
        except OSError as exc:
            raise FetchError(f"{url}: cannot read it ({exc.strerror})") from None
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return response.read()
    except urllib.error.HTTPError as exc:
        raise FetchError(f"{url} answered HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise FetchError(f"{url}: cannot connect ({getattr(exc, 'reason', exc)})") from None


def _gpgv(keyring: Path, *files: Path, output: Path | None = None) -> str | None:
    """None when ``files`` (a detached signature and its file, or one clearsigned file) carry a
    good signature by a key of ``keyring``, else gpgv's complaint; ``output``: where gpgv
    writes the signed text of a clearsigned file (what was checked, nothing around it)."""
    with tempfile.TemporaryDirectory(prefix="p40fleet-gpgv.") as home:
        out = ["--output", str(output)] if output is not None else []
        command = ["gpgv", "--homedir", home, *out, "--keyring", str(keyring.resolve())]
        proc = subprocess.run([*command, *map(str, files)], capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    return (
        proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
    )


def _release_text(url: str, cache: Path, keyring: Path | None, refresh: bool, log) -> str:
    """The Release text at ``url`` (a suite's ``dists/SUITE``, a flat repository's
    directory), fetched once into ``cache`` (again when ``refresh``). With a keyring, from
    ``InRelease`` (the signed text gpgv checked: one file, so a mirror caught mid-update cannot
    pair one Release with another's signature), else ``Release`` and ``Release.gpg``; without
    one, ``Release`` unchecked."""
    inrelease, release, detached = cache / "InRelease", cache / "Release", cache / "Release.gpg"
    if keyring is None:
        if refresh or not release.is_file():
            log(f"fetching {url}/Release")
            release.write_bytes(_read(f"{url}/Release"))
        return release.read_text()
    if refresh or not (inrelease.is_file() or (release.is_file() and detached.is_file())):
        for path in (inrelease, release, detached):
            path.unlink(missing_ok=True)
        log(f"fetching {url}/InRelease")
        try:
            inrelease.write_bytes(_read(f"{url}/InRelease"))
        except FetchError:  # an older archive: the detached pair
            log(f"fetching {url}/Release and Release.gpg")
            release.write_bytes(_read(f"{url}/Release"))
            detached.write_bytes(_read(f"{url}/Release.gpg"))
    if inrelease.is_file():
        release.unlink(missing_ok=True)
        bad = _gpgv(keyring, inrelease, output=release)
        which = "InRelease"
    else:
        bad = _gpgv(keyring, detached, release)
        which = "Release.gpg"
    if bad is not None:
        for path in (inrelease, release, detached):
            path.unlink(missing_ok=True)
        raise AptError(
            f"{url}/{which}: the signature does not verify with {keyring} ({bad}): not used. "
            "Fix: the keyring of that archive (or a mirror that serves its files as they are)"
        )
    return release.read_text()


def read_indexes(
    mirror: Path, upstream: Upstream, refresh: bool = False, log=lambda _m: None
) -> tuple[list[Package], list[str]]:
    """Every package of the upstream's indexes, each index checked against its Release, and
    notes on what was not checked. A cached index is read again from the upstream only when
    ``refresh`` or when it no longer matches its Release."""
    base = upstream.url.rstrip("/")
    if upstream.keyring is None and urlsplit(base).scheme == "http":
        if not upstream.allow_unverified:
            raise AptError(
                f"{base}: a plain-http upstream and no --upstream-keyring: anyone on the path "
                "could choose the packages this mirror then signs as its own. Fix: pass "
                f"--upstream-keyring (Ubuntu's: {UBUNTU_KEYRING}, package ubuntu-keyring), "
                "or --allow-unverified-upstream to accept the transport's word"
            )
    notes = []
    packages: list[Package] = []
    for suite in upstream.suites:
        flat = flat_dir(suite)
        if flat is not None:
            cache = mirror / ".cache" / "apt-flat" / flat
            url = f"{base}/{flat}" if flat else base
        else:
            cache = mirror / ".cache" / "apt" / suite
            url = f"{base}/dists/{suite}"
        cache.mkdir(parents=True, exist_ok=True)
        text = _release_text(url, cache, upstream.keyring, refresh, log)
        if upstream.keyring is None:
            notes.append(f"{url}/Release: signature not checked (no keyring)")
        if flat is not None:
            data, note = _flat_index(url, text, cache, upstream.allow_unverified, refresh, log)
            notes += [note] if note else []
            for stanza in paragraphs(data.decode("utf-8")):
                packages.append(Package(stanza, base, flat=True))
            continue
        sums = release_sums(text)
        for component in upstream.components:
            stem = f"{component}/binary-{upstream.arch}"
            name, unpack = next(
                ((n, u) for n, u in _INDEX_NAMES if f"{stem}/{n}" in sums), (None, None)
            )
            if name is None or unpack is None:
                raise AptError(f"{url}/Release lists no {stem}/Packages index")
            sha, size = sums[f"{stem}/{name}"]
            local = cache / stem / name
            if not (local.is_file() and sha256_of(local) == sha):
                log(f"fetching {url}/{stem}/{name}")
                fetch(f"{url}/{stem}/{name}", local, sha, size=size, progress=False)
            for stanza in paragraphs(unpack(local.read_bytes()).decode("utf-8")):
                packages.append(Package(stanza, base))
    return packages, notes


def _flat_index(
    url: str, release: str, cache: Path, allow_unverified: bool, refresh: bool, log
) -> tuple[bytes, str | None]:
    """A flat repository's Packages index (unpacked) and a note on what was not checked. The
    first index of :data:`_INDEX_NAMES` its Release lists with a SHA256 (its MD5Sum checked
    too when listed); one listed with an MD5Sum only, or none listed with any sum, is refused
    unless ``allow_unverified`` (apt itself refuses MD5 as not strong enough)."""
    sha256 = release_hashes(release, "SHA256") or {}
    md5 = release_hashes(release, "MD5Sum") or {}
    for sums, strong in ((sha256, True), (md5, False)):
        name, unpack = next(((n, u) for n, u in _INDEX_NAMES if n in sums), (None, None))
        if name is None or unpack is None:
            continue
        note = None
        if not strong:
            if not allow_unverified:
                raise AptError(
                    f"{url}/Release lists {name} with an MD5Sum only (no SHA256): MD5 is not "
                    "strong enough to pin what the mirror signs. Fix: an upstream whose Release "
                    "has SHA256 sums, or --allow-unverified-upstream to accept the MD5 check"
                )
            note = f"{url}/{name}: checked against the Release's MD5Sum only (no SHA256)"
        want, size = sums[name]
        local = cache / name
        have = local.is_file() and digest_of(local, "sha256" if strong else "md5") == want
        if not have:
            log(f"fetching {url}/{name}")
            pin, pin_md5 = (want, md5.get(name, (None, 0))[0]) if strong else (None, want)
            fetch(f"{url}/{name}", local, pin, md5=pin_md5, size=size, progress=False)
        return unpack(local.read_bytes()), note
    if not allow_unverified:
        raise AptError(
            f"{url}/Release lists no SHA256 (nor MD5Sum) of a Packages index: nothing to check "
            "the index against. Fix: an upstream whose Release lists its indexes' sums, or "
            "--allow-unverified-upstream to take the index unchecked"
        )
    if refresh:  # a stale index of another compression must not stand in for the new one
        for name, _ in _INDEX_NAMES:
            (cache / name).unlink(missing_ok=True)
    for name, unpack in _INDEX_NAMES:
        local = cache / name
        if not local.is_file():
            try:
                data = _read(f"{url}/{name}")
            except FetchError:
                continue
            log(f"fetched {url}/{name} (unchecked)")
            local.write_bytes(data)
        return unpack(local.read_bytes()), f"{url}/{name}: not checked (the Release lists no sum)"
    raise AptError(f"{url}: no Packages index ({', '.join(n for n, _ in _INDEX_NAMES)})")


def _pool_path(package: Package) -> tuple[str, str]:
    """Where ``package``'s .deb is, relative to its upstream, and where the mirror keeps it,
    relative to DIR/apt: the same path for a dists-style upstream, under ``pool/`` for a flat
    one (whose ``Filename`` is often ``./NAME.deb``, next to the Release)."""
    filename = package.stanza.get("Filename", "")
    norm = posixpath.normpath(filename)
    expected = filename.removeprefix("./") if package.flat else filename
    if not filename or norm.startswith(("/", "..")) or norm != expected:
        raise AptError(f"{package.name} {package.version}: Filename {filename!r} is no "
                       "relative path inside the repository")  # fmt: skip
    return norm, f"pool/{norm}" if package.flat else norm


def fetch_debs(
    mirror: Path,
    chosen: dict[str, Package],
    manifest: Manifest,
    count,
    progress: bool = False,
    log=lambda _m: None,
) -> list[str]:
    """Fetch the .debs the mirror lacks (each checked against its index's SHA256 and Size);
    returns one problem per .deb that could not be got."""
    problems = []
    for name in sorted(chosen):
        package = chosen[name]
        try:
            rel, kept = _pool_path(package)
            sha = package.stanza.get("SHA256")
            size = int(package.stanza.get("Size", "-1"))
            if not sha:
                raise AptError("its index paragraph has no SHA256")
            path = f"apt/{kept}"
            target = mirror / path
            entry = manifest.entries.get(path)
            if not (
                entry is not None
                and entry.sha256 == sha
                and target.is_file()
                and target.stat().st_size == size
                and sha256_of(target) == sha
            ):
                url = f"{package.base_url}/{rel}"
                log(f"fetching {url}")
                moved = fetch(url, target, sha, size=size, progress=progress)
                if target.stat().st_size != size:
                    target.unlink()
                    raise AptError(f"{url}: {moved} bytes, the index says {size}: not kept")
                count("apt", moved)
                manifest.add(Entry("apt", f"{name}={package.version}", path, url, sha, size))
        except (AptError, FetchError, ValueError) as exc:
            problems.append(f"apt {package.stanza.get('Filename', name)}: {exc}")
    return problems


# -- the mirror's own repository ------------------------------------------------------------


def _gpg(keys: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [
            "gpg",
            "--homedir",
            str(keys),
            "--batch",
            "--yes",
            "--pinentry-mode",
            "loopback",
            "--passphrase",
            "",
            *args,
        ],  # fmt: skip
        capture_output=True,
        text=True,
    )
    if check and proc.returncode != 0:
        raise AptError(f"gpg {' '.join(args[:2])} failed: {proc.stderr.strip()[-400:]}")
    return proc


def ensure_key(keys: Path) -> str:
    """The fingerprint of the mirror's signing key in ``keys`` (a GNUPGHOME), made the first
    time (ed25519, no passphrase: the build signs unattended; keep DIR/keys to yourself)."""
    if shutil.which("gpg") is None:
        raise AptError("gpg is not installed: cannot sign the repository (apt-get install gpg)")
    keys.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(keys, 0o700)
    for _ in range(2):
        listed = _gpg(keys, "--with-colons", "--list-secret-keys", check=False).stdout
        fprs = [line.split(":")[9] for line in listed.splitlines() if line.startswith("fpr:")]
        if fprs:
            return fprs[0]
        _gpg(keys, "--quick-generate-key", KEY_UID, "ed25519", "sign", "never")
    raise AptError(f"{keys}: gpg made no key")


def _stop_agent(keys: Path) -> None:
    subprocess.run(["gpgconf", "--homedir", str(keys), "--kill", "gpg-agent"],
                   capture_output=True)  # fmt: skip


def _packages_text(chosen: dict[str, Package]) -> bytes:
    out = []
    for name in sorted(chosen):
        stanza = dict(chosen[name].stanza)
        if chosen[name].flat:  # the mirror is dists-style: its Filename is where it keeps it
            stanza["Filename"] = _pool_path(chosen[name])[1]
        lines = []
        for key, value in stanza.items():
            first, *rest = value.split("\n")
            lines.append(f"{key}: {first}".rstrip())
            lines += [f" {line}" for line in rest]
        out.append("\n".join(lines) + "\n")
    return "\n".join(out).encode()


def write_repository(
    mirror: Path, suite: str, arch: str, chosen: dict[str, Package], manifest: Manifest
) -> bool:
    """Write and sign ``DIR/apt/dists/SUITE`` for ``chosen``; record every file in the
    manifest. Returns whether anything was written (False: the signed index already says it)."""
    keys = mirror / "keys"
    apt = mirror / "apt"
    fpr = ensure_key(keys)
    try:
        public = apt / KEY_FILE
        apt.mkdir(parents=True, exist_ok=True)
        exported = subprocess.run(["gpg", "--homedir", str(keys), "--batch", "--export", fpr],
                                  capture_output=True, check=True).stdout  # fmt: skip
        if not public.is_file() or public.read_bytes() != exported:
            public.write_bytes(exported)
        dist = apt / "dists" / suite
        binary = dist / COMPONENT / f"binary-{arch}"
        text = _packages_text(chosen)
        release, inrelease, detached = dist / "Release", dist / "InRelease", dist / "Release.gpg"
        unchanged = (
            (binary / "Packages").is_file()
            and (binary / "Packages").read_bytes() == text
            and release.is_file()
            and inrelease.is_file()
            and _gpgv(public, detached, release) is None
            and _gpgv(public, inrelease) is None
        )
        if not unchanged:
            binary.mkdir(parents=True, exist_ok=True)
            (binary / "Packages").write_bytes(text)
            with gzip.GzipFile(binary / "Packages.gz", "wb", mtime=0) as gz:
                gz.write(text)
            sums = []
            for name in ("Packages", "Packages.gz"):
                f = binary / name
                sums.append(f" {sha256_of(f)} {f.stat().st_size:>16} "
                            f"{COMPONENT}/binary-{arch}/{name}")  # fmt: skip
            fields = [
                "Origin: p40fleet-mirror",
                "Label: p40fleet-mirror",
                f"Suite: {suite}",
                f"Codename: {suite}",
                f"Date: {formatdate(time.time(), usegmt=True)}",
                f"Architectures: {arch}",
                f"Components: {COMPONENT}",
                "Description: p40fleet air-gapped mirror (python -m p40fleet.mirror build)",
                "SHA256:",
                *sums,
            ]
            release.write_text("\n".join(fields) + "\n")
            _gpg(keys, "--local-user", fpr, "--digest-algo", "SHA512", "--armor",
                 "--detach-sign", "--output", str(detached), str(release))  # fmt: skip
            _gpg(keys, "--local-user", fpr, "--digest-algo", "SHA512", "--clearsign",
                 "--output", str(inrelease), str(release))  # fmt: skip
    finally:
        _stop_agent(keys)
    for f in (public, release, inrelease, detached, binary / "Packages", binary / "Packages.gz"):
        rel = f.relative_to(mirror).as_posix()
        manifest.add(Entry("apt", f.relative_to(apt).as_posix(), rel, "", sha256_of(f),
                           f.stat().st_size))  # fmt: skip
    return not unchanged


def stack_apt(base_url: str, suite: str, mirror: Path) -> dict:
    """``stack["mirror"]["apt"]`` for this repository served at ``base_url``."""
    return {
        "url": f"{base_url.rstrip('/')}/apt",
        "suite": suite,
        "components": [COMPONENT],
        "signed_by": str((mirror / "apt" / KEY_FILE).resolve()),
    }
