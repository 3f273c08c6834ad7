"""p40fleet.mirror's apt part: the closure resolved from a Packages index, each .deb checked
against its index and each index against its Release, a repository signed with the mirror's
own key that apt-get itself accepts with ``signed-by`` (issue 27).

"Upstream" is a fake dists-style archive in a temp dir (tiny .debs made with ``dpkg-deb
--build``, two suites, a virtual package and an alternative, a Release signed by a throwaway
"archive" key), served by p40fleet's own mirror server, which logs every request.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from email.utils import formatdate
from functools import partial
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from p40fleet.mirror import apt as apt_repo
from p40fleet.mirror.build import AptPlan, MirrorError, build
from p40fleet.mirror.debian import (
    AptError,
    Index,
    Package,
    compare_versions,
    installed_packages,
    paragraphs,
    relations,
    release_sums,
)
from p40fleet.mirror.fetch import FetchError
from p40fleet.mirror.manifest import verify
from p40fleet.mirror.serve import RangeFileHandler

pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("dpkg-deb", "gpg", "gpgv")), reason="needs dpkg-deb, gpg"
)

KERNEL = "5.4.0-150-generic"

#: (suite, package, version, arch, fields): a small archive shaped like focal's.
UPSTREAM = [
    ("focal", "dkms", "2.8.1-5ubuntu2", "all",
     {"Pre-Depends": "kmod", "Depends": "nocc | c-compiler, make (>= 4.1), lsb-release:any"}),
    ("focal", "kmod", "27-1ubuntu2", "amd64", {}),
    ("focal", "fakecc", "1.0", "amd64", {"Provides": "c-compiler"}),
    ("focal", "make", "4.0-1", "amd64", {}),
    ("focal-updates", "make", "4.2.1-1.2", "amd64", {}),
    ("focal", "lsb-release", "11.1.0ubuntu2", "all", {"Multi-Arch": "allowed"}),
    ("focal", "build-essential", "12.8ubuntu1", "amd64",
     {"Depends": "libc6-dev | libc-dev, make, fakecc (>= 1.0~)"}),
    ("focal", "libc6-dev", "2.31-0ubuntu9", "amd64", {"Depends": "libc6 (= 2.31-0ubuntu9)"}),
    ("focal", "libc6", "2.31-0ubuntu9", "amd64", {}),
    ("focal", "pkg-config", "0.29.1-0ubuntu4", "amd64", {"Depends": "libc6 (>= 2.14)"}),
    ("focal", "libglvnd-dev", "1.3.1-1", "amd64", {}),
    ("focal-updates", f"linux-headers-{KERNEL}", "5.4.0-150.167", "amd64",
     {"Depends": "linux-headers-5.4.0-150, libc6 (>= 2.14)"}),
    ("focal-updates", "linux-headers-5.4.0-150", "5.4.0-150.167", "all", {}),
    ("focal", "unrelated", "1.0", "amd64", {"Depends": "make"}),
]  # fmt: skip
CLOSURE = {
    "build-essential", "dkms", "fakecc", "kmod", "lsb-release", "libc6", "libc6-dev",
    "libglvnd-dev", "linux-headers-5.4.0-150", f"linux-headers-{KERNEL}", "make", "pkg-config",
}  # fmt: skip


def _gpg(home: Path, *args: str) -> subprocess.CompletedProcess:
    """gpg as the mirror's build runs it (its own homedir, no passphrase), for the fake archive."""
    return apt_repo._gpg(home, *args)


def _make_key(home: Path, uid: str) -> Path:
    """A throwaway signing key in GNUPGHOME ``home``; returns its exported public keyring."""
    home.mkdir(mode=0o700)
    _gpg(home, "--quick-generate-key", uid, "ed25519", "sign", "never")
    ring = home / "public.gpg"
    _gpg(home, "--output", str(ring), "--export")
    return ring


def _sum(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _release(sums: dict[str, bytes], suite: str) -> str:
    lines = [f"Suite: {suite}", f"Codename: {suite}", "Architectures: amd64",
             "Components: main", "SHA256:"]  # fmt: skip
    lines += [f" {_sum(d)} {len(d)} {p}" for p, d in sorted(sums.items())]
    return "\n".join(lines) + "\n"


def _make_deb(work: Path, deb: Path, name: str, version: str, arch: str, fields: dict) -> str:
    """A real .deb at ``deb`` (dpkg-deb --build); returns its control text."""
    pkg = work / f"{name}_{version}"
    (pkg / "DEBIAN").mkdir(parents=True)
    control = {"Package": name, "Version": version, "Architecture": arch,
               "Maintainer": "t <t@t>", **fields,
               "Description": f"fake {name}\n a test package"}  # fmt: skip
    text = "".join(f"{k}: {v}\n" for k, v in control.items())
    (pkg / "DEBIAN/control").write_text(text)
    (pkg / "usr/share/doc" / name).mkdir(parents=True)
    (pkg / "usr/share/doc" / name / "README").write_text(f"{name} {version}\n")
    deb.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(pkg),
                    str(deb)], check=True, capture_output=True)  # fmt: skip
    return text


def _stanza(text: str, rel: str, data: bytes) -> str:
    """An index paragraph for control ``text`` of a .deb at ``rel`` holding ``data``."""
    return text.replace(
        "Description:", f"Filename: {rel}\nSize: {len(data)}\nSHA256: {_sum(data)}\nDescription:"
    )


def _build_upstream(root: Path, work: Path, home: Path) -> dict[str, Path]:
    """The fake archive under ``root``: pool/ + dists/SUITE/{Release,Release.gpg,main/...}."""
    stanzas: dict[str, list[str]] = {}
    debs = {}
    for suite, name, version, arch, fields in UPSTREAM:
        rel = f"pool/main/{name[0]}/{name}/{name}_{version}_{arch}.deb"
        deb = root / rel
        text = _make_deb(work, deb, name, version, arch, fields)
        stanzas.setdefault(suite, []).append(_stanza(text, rel, deb.read_bytes()))
        debs[name if suite == "focal" or name != "make" else "make-updates"] = deb
    for suite, entries in stanzas.items():
        dist = root / "dists" / suite
        binary = dist / "main/binary-amd64"
        binary.mkdir(parents=True)
        packages = "\n".join(entries).encode()
        (binary / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
        release = dist / "Release"
        release.write_text(_release({"main/binary-amd64/Packages.gz":
                                     (binary / "Packages.gz").read_bytes()}, suite))  # fmt: skip
        _gpg(home, "--armor", "--detach-sign", "--output", str(dist / "Release.gpg"),
             str(release))  # fmt: skip
        if suite == "focal":  # as Ubuntu's; focal-updates has the detached pair only (older)
            _gpg(home, "--clearsign", "--output", str(dist / "InRelease"), str(release))
    return debs


def _serve(root: Path, log: Path):
    handler = type("H", (RangeFileHandler,), {"access_log": log})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _log_lines(log: Path) -> list[str]:
    seen, stable = None, 0
    while stable < 3:  # the server logs a request after its response: let it
        time.sleep(0.05)
        now = log.read_text().splitlines() if log.exists() else []
        stable = stable + 1 if now == seen else 0
        seen = now
    return seen


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("archive")
    ring = _make_key(tmp / "archive-key", "fake archive <archive@test.invalid>")
    other = _make_key(tmp / "other-key", "someone else <other@test.invalid>")
    root = tmp / "upstream"
    debs = _build_upstream(root, tmp / "work", tmp / "archive-key")
    log = tmp / "upstream-access.log"
    server, base = _serve(root, log)
    yield {"root": root, "base": base, "ring": ring, "other": other, "debs": debs, "log": log,
           "home": tmp / "archive-key"}  # fmt: skip
    server.shutdown()
    for home in ("archive-key", "other-key"):
        subprocess.run(["gpgconf", "--homedir", str(tmp / home), "--kill", "gpg-agent"])


def _plan(archive, keyring: Path | None = None, **kw) -> AptPlan:
    upstream = apt_repo.Upstream(
        url=archive["base"], suites=("focal", "focal-updates"), components=("main",),
        keyring=archive["ring"] if keyring is None else keyring, **kw,
    )  # fmt: skip
    return AptPlan(tuple(apt_repo.deploy_packages([KERNEL])), upstream,
                   base_url="http://10.0.0.5:8111")  # fmt: skip


# -- the parsers and the resolver, no network ---------------------------------------------


def test_debian_versions_sort_as_dpkg_sorts_them():
    ordered = ["1.0~rc1", "1.0", "1.0-1", "1.0-1ubuntu1", "1.0a", "1.0.1", "2.31-0ubuntu9.2",
               "2.31-0ubuntu9.10", "1:0.1"]  # fmt: skip
    for a, b in zip(ordered, ordered[1:], strict=False):
        assert compare_versions(a, b) < 0, (a, b)
        assert compare_versions(b, a) > 0, (b, a)
    assert compare_versions("0:4.2", "4.2") == 0
    if shutil.which("dpkg"):  # and dpkg itself agrees
        for a, b in zip(ordered, ordered[1:], strict=False):
            subprocess.run(["dpkg", "--compare-versions", a, "lt", b], check=True)


def test_relations_and_paragraphs_parse_what_an_ubuntu_index_writes():
    groups = relations("libc6 (>= 2.14), gcc | c-compiler,\n python3:any (>= 3.8~), make")
    assert [[str(r) for r in g] for g in groups] == [
        ["libc6 (>= 2.14)"], ["gcc", "c-compiler"], ["python3 (>= 3.8~)"], ["make"]]  # fmt: skip
    text = "Package: a\nDescription: x\n more\n .\n end\n\nPackage: b\nVersion: 1\n"
    assert paragraphs(text) == [{"Package": "a", "Description": "x\nmore\n.\nend"},
                                {"Package": "b", "Version": "1"}]  # fmt: skip
    sums = release_sums("Origin: U\nSHA256:\n " + "a" * 64 + " 12 main/binary-amd64/Packages\n")
    assert sums == {"main/binary-amd64/Packages": ("a" * 64, 12)}
    with pytest.raises(AptError, match="no SHA256 field"):
        release_sums("Origin: U\nMD5Sum:\n 0123 1 x\n")


def _index(*specs: tuple[str, str, dict]) -> Index:
    return Index(Package({"Package": n, "Version": v, **f}, "u") for n, v, f in specs)


def test_the_closure_takes_the_highest_version_providers_and_the_first_alternative():
    index = _index(
        ("top", "1", {"Depends": "missing | virt, lib (>= 2)", "Pre-Depends": "pre"}),
        ("impl", "1", {"Provides": "virt"}),
        ("lib", "1", {}),
        ("lib", "3", {}),
        ("pre", "1", {}),
        ("other", "1", {"Depends": "lib"}),
    )
    chosen = index.closure(["top"])
    assert sorted(chosen) == ["impl", "lib", "pre", "top"]
    assert chosen["lib"].version == "3"
    # a group the closure already satisfies adds nothing: "impl | alt" keeps impl alone
    index = _index(("a", "1", {"Depends": "impl, alt | impl"}), ("impl", "1", {}),
                   ("alt", "1", {}))  # fmt: skip
    assert sorted(index.closure(["a"])) == ["a", "impl"]


def test_a_relation_nothing_satisfies_is_named_with_who_asked():
    index = _index(
        ("top", "1", {"Depends": "lib (>= 5)"}),
        ("lib", "3", {}),
        ("v", "1", {"Provides": "virt"}),
        ("w", "1", {"Depends": "virt (>= 2)"}),
    )
    with pytest.raises(AptError) as caught:
        index.closure(["top", "w", "nosuch"])
    text = str(caught.value)
    assert "lib (>= 5) (Depends of top 1): no package" in text
    assert "virt (>= 2) (Depends of w 1)" in text  # an unversioned Provides is not enough
    assert "nosuch (asked for)" in text


def test_what_the_hosts_have_installed_is_not_mirrored_unless_too_old_or_asked_for():
    """``--apt-installed``: a dependency the hosts' dpkg status satisfies (by name or by a
    versioned Provides) is left out with what only it needs; an installed version too old for
    the relation is mirrored; a root is always mirrored (an upstream that is only what the base
    image lacks, as the lab's, then still closes)."""
    index = _index(
        ("build-essential", "12", {"Depends": "gcc, libc6-dev (>= 2.36), make"}),
        ("gcc", "12", {"Depends": "libc6 (>= 2.36), cpp"}),
        ("libc6-dev", "2.36", {"Depends": "libc6 (= 2.36)"}),
        ("make", "4.3", {}),
    )  # no libc6, no cpp in this upstream: the base image has them
    status = """Package: libc6
Status: install ok installed
Version: 2.36

Package: cpp-12
Status: install ok installed
Version: 12
Provides: cpp (= 12)

Package: make
Status: install ok installed
Version: 4.2

Package: gone
Status: deinstall ok config-files
Version: 1
Provides: libc6-dev (= 9)
"""
    installed = Index(installed_packages(status))
    assert sorted(installed.candidates) == ["cpp-12", "libc6", "make"]
    with pytest.raises(AptError, match="libc6 .* no package"):
        index.closure(["build-essential"])  # without it: the upstream does not close
    chosen = index.closure(["build-essential", "make"], installed)
    assert sorted(chosen) == ["build-essential", "gcc", "libc6-dev", "make"]  # make: a root
    old = Index(installed_packages(status.replace("Version: 2.36", "Version: 2.31")))
    with pytest.raises(AptError, match=r"libc6 \(>= 2.36\) \(Depends of gcc 12\)"):
        index.closure(["build-essential"], old)  # 2.31 installed is too old: needs the mirror


def test_the_apt_packages_are_the_ones_the_driver_operation_installs():
    from p40fleet.operations.driver import BUILD_PACKAGES

    kernels = ["5.4.0-150-generic", "5.4.0-169-generic"]
    assert apt_repo.deploy_packages(kernels) == [
        *BUILD_PACKAGES,
        "linux-headers-5.4.0-150-generic",
        "linux-headers-5.4.0-169-generic",
    ]


# -- build against the fake archive ---------------------------------------------------------


def test_build_mirrors_the_closure_signed_and_a_second_build_fetches_nothing(tmp_path, archive):
    mirror = tmp_path / "mirror"
    before = len(_log_lines(archive["log"]))
    result = build(mirror, [], progress=False, apt=_plan(archive))
    files, moved = result.fetched["apt"]
    assert files == len(CLOSURE)
    pool = {p.name.split("_")[0] for p in (mirror / "apt/pool").rglob("*.deb")}
    assert pool == CLOSURE  # nothing unrelated, the provider of c-compiler, not "nocc"
    packages = paragraphs((mirror / "apt/dists/focal/main/binary-amd64/Packages").read_text())
    assert {p["Package"]: p["Version"] for p in packages}["make"] == "4.2.1-1.2"  # -updates
    with gzip.open(mirror / "apt/dists/focal/main/binary-amd64/Packages.gz") as gz:
        assert gz.read() == (mirror / "apt/dists/focal/main/binary-amd64/Packages").read_bytes()
    release = mirror / "apt/dists/focal/Release"
    assert release_sums(release.read_text()).keys() == {
        "main/binary-amd64/Packages", "main/binary-amd64/Packages.gz"}  # fmt: skip
    key = mirror / "apt/p40fleet-mirror.gpg"
    for signature, signed in (("Release.gpg", [str(release)]), ("InRelease", [])):
        subprocess.run(["gpgv", "--keyring", str(key), str(release.parent / signature),
                        *signed], check=True, capture_output=True)  # fmt: skip
    assert (mirror / "keys").stat().st_mode & 0o077 == 0
    manifest = json.loads((mirror / "manifest.json").read_text())
    apt_entries = [e for e in manifest["files"] if e["kind"] == "apt"]
    debs = [e for e in apt_entries if e["path"].endswith(".deb")]
    assert len(debs) == len(CLOSURE) and all(e["url"].startswith(archive["base"]) for e in debs)
    assert {"dists/focal/InRelease", "p40fleet-mirror.gpg"} <= {e["name"] for e in apt_entries}
    assert result.apt == {"url": "http://10.0.0.5:8111/apt", "suite": "focal",
                          "components": ["main"], "signed_by": str(key.resolve())}  # fmt: skip
    gets = _log_lines(archive["log"])[before:]
    assert len([g for g in gets if ".deb " in g]) == len(CLOSURE)  # each .deb once
    assert verify(mirror) == ([], len(apt_entries))

    signed = (release.parent / "InRelease").read_bytes()
    mark = len(_log_lines(archive["log"]))
    again = build(mirror, [], progress=False, apt=_plan(archive))
    assert again.fetched == {}
    assert _log_lines(archive["log"])[mark:] == []  # not even an index
    assert (release.parent / "InRelease").read_bytes() == signed  # not signed again
    # --apt-refresh reads the upstream's indexes again, and still fetches no .deb
    refresh = AptPlan(_plan(archive).packages, _plan(archive).upstream, refresh=True)
    build(mirror, [], progress=False, apt=refresh)
    again = _log_lines(archive["log"])[mark:]
    assert again and not [g for g in again if ".deb " in g]


def test_a_deb_whose_sum_differs_from_the_index_is_refused_and_named(tmp_path, archive):
    deb = archive["debs"]["kmod"]
    original = deb.read_bytes()
    flipped = bytearray(original)
    flipped[-1] ^= 1
    deb.write_bytes(bytes(flipped))
    try:
        with pytest.raises(MirrorError) as caught:
            build(tmp_path / "mirror", [], progress=False, apt=_plan(archive))
    finally:
        deb.write_bytes(original)
    text = str(caught.value)
    rel = deb.relative_to(archive["root"]).as_posix()
    assert f"apt {rel}: " in text and "is not the pinned" in text
    assert "the repository index is not written" in text
    assert not (tmp_path / "mirror/apt" / rel).exists()
    assert not (tmp_path / "mirror/apt/dists").exists()  # no index naming a missing file
    assert (tmp_path / "mirror/apt/pool/main/d/dkms").is_dir()  # the rest was fetched


def _flip_middle_byte(data: bytes) -> bytes:
    """``data`` with one byte changed and its length kept (a longer index would be refused for
    its size before its sum is looked at)."""
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1 :]


def test_an_index_whose_sum_differs_from_the_release_is_refused(tmp_path, archive):
    index = archive["root"] / "dists/focal/main/binary-amd64/Packages.gz"
    original = index.read_bytes()
    index.write_bytes(_flip_middle_byte(original))  # the size the Release says, another sum
    try:
        with pytest.raises(MirrorError, match="Packages.gz: sha256 .* is not the pinned"):
            build(tmp_path / "mirror", [], progress=False, apt=_plan(archive))
    finally:
        index.write_bytes(original)
    assert not list((tmp_path / "mirror").rglob("*.deb"))


def test_the_upstream_release_is_checked_with_the_keyring(tmp_path, archive):
    with pytest.raises(MirrorError, match="signature does not verify with .*other-key"):
        build(tmp_path / "m1", [], progress=False, apt=_plan(archive, keyring=archive["other"]))
    assert not list((tmp_path / "m1").rglob("*.deb"))
    # the signed text is what counts: InRelease edited after signing is refused (and a Release
    # that no longer matches its Release.gpg is not read where InRelease exists)
    dist = archive["root"] / "dists/focal"
    inrelease, release = (dist / "InRelease").read_bytes(), (dist / "Release").read_bytes()
    try:
        (dist / "Release").write_bytes(release.replace(b"Suite: focal", b"Suite: other"))
        assert build(tmp_path / "m3", [], progress=False, apt=_plan(archive)).apt is not None
        (dist / "InRelease").write_bytes(inrelease.replace(b"Suite: focal", b"Suite: other"))
        with pytest.raises(MirrorError, match="focal/InRelease: the signature does not verify"):
            build(tmp_path / "m4", [], progress=False, apt=_plan(archive))
    finally:
        (dist / "InRelease").write_bytes(inrelease)
        (dist / "Release").write_bytes(release)
    # plain http and no keyring: refused, unless told to accept the transport's word
    plan = _plan(archive)
    unchecked = AptPlan(plan.packages, apt_repo.Upstream(url=archive["base"],
                        suites=("focal", "focal-updates"), components=("main",)))  # fmt: skip
    with pytest.raises(MirrorError, match="plain-http upstream and no --upstream-keyring"):
        build(tmp_path / "m2", [], progress=False, apt=unchecked)
    allowed = AptPlan(plan.packages, apt_repo.Upstream(url=archive["base"],
                      suites=("focal", "focal-updates"), components=("main",),
                      allow_unverified=True))  # fmt: skip
    assert build(tmp_path / "m2", [], progress=False, apt=allowed).apt is not None


def test_verify_names_a_flipped_byte_in_a_deb_and_a_missing_index(tmp_path, archive):
    mirror = tmp_path / "mirror"
    build(mirror, [], progress=False, apt=_plan(archive))
    deb = next((mirror / "apt/pool/main/m/make").glob("*.deb"))
    data = bytearray(deb.read_bytes())
    data[100] ^= 1
    deb.write_bytes(bytes(data))
    (mirror / "apt/dists/focal/InRelease").unlink()
    problems, _ = verify(mirror)
    rel = deb.relative_to(mirror).as_posix()
    assert [p.split(":")[0] for p in problems] == ["apt/dists/focal/InRelease", rel], problems
    assert "missing (apt dists/focal/InRelease)" in problems[0]
    # a build repairs both: the .deb fetched again, the index signed again
    build(mirror, [], progress=False, apt=_plan(archive))
    assert verify(mirror)[0] == []


def _raw_get(base: str, path: str) -> bytes:
    """GET ``path`` exactly as written (urllib would normalise ``..`` and ``//``)."""
    import http.client

    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    if response.status != 200:
        raise urllib.error.HTTPError(path, response.status, response.reason, response.msg, None)
    return body


def _apt_get(root: Path, sources: str, *args: str) -> subprocess.CompletedProcess:
    """apt-get with its own sources, state and cache under ``root`` (the host's untouched)."""
    for sub in ("state/lists/partial", "cache/archives/partial", "etc/preferences.d",
                "etc/apt.conf.d", "etc/trusted.gpg.d"):  # fmt: skip
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "status").touch()
    (root / "sources.list").write_text(sources)
    options = {
        "Dir::Etc::sourcelist": root / "sources.list",
        "Dir::Etc::sourceparts": root / "nonexistent",
        "Dir::Etc::preferencesparts": root / "etc/preferences.d",
        "Dir::Etc::parts": root / "etc/apt.conf.d",
        "Dir::Etc::trustedparts": root / "etc/trusted.gpg.d",
        "Dir::Etc::trusted": root / "etc/trusted.gpg",
        "Dir::State": root / "state",
        "Dir::State::status": root / "status",
        "Dir::Cache": root / "cache",
        "APT::Architecture": "amd64",
        "APT::Architectures": "amd64",
        "APT::Sandbox::User": "root",
        "Acquire::Languages": "none",
    }
    command = ["apt-get", "-q", *(f"-o{k}={v}" for k, v in options.items()), *args]
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("apt-get"), reason="apt-get as root")
def test_apt_get_accepts_the_mirror_signed_by_its_key_and_refuses_another_key(tmp_path, archive):
    """The proof that matters: apt's own signature check (gpgv with signed-by) passes, apt
    resolves the deploy's packages from the mirror alone and downloads them by its sums."""
    mirror = tmp_path / "mirror"
    block = build(mirror, [], progress=False, apt=_plan(archive)).apt
    assert block is not None
    log = tmp_path / "mirror-access.log"
    server, base = _serve(mirror, log)
    try:
        line = (f"deb [signed-by={block['signed_by']}] {base}/apt {block['suite']} "
                f"{' '.join(block['components'])}\n")  # fmt: skip
        update = _apt_get(tmp_path / "ok", line, "update")
        assert update.returncode == 0, update.stdout + update.stderr
        assert "W:" not in update.stdout + update.stderr, update.stdout + update.stderr
        wanted = apt_repo.deploy_packages([KERNEL])
        got = _apt_get(tmp_path / "ok", line, "install", "-y", "--download-only",
                       "--no-install-recommends", *wanted)  # fmt: skip
        assert got.returncode == 0, got.stdout + got.stderr
        fetched = {p.name.split("_")[0] for p in (tmp_path / "ok/cache/archives").glob("*.deb")}
        assert fetched == CLOSURE  # the closure is complete: apt found every dependency
        # the same repository under a key that did not sign it: apt refuses it
        wrong = line.replace(block["signed_by"], str(archive["other"]))
        refused = _apt_get(tmp_path / "bad", wrong, "update")
        out = refused.stdout + refused.stderr
        assert refused.returncode != 0 and "NO_PUBKEY" in out, out
        # the signing key is never served
        for path in ("/keys/pubring.kbx", "//keys/pubring.kbx", "/apt/../keys/pubring.kbx",
                     "/%6beys/pubring.kbx", "/./keys/"):  # fmt: skip
            with pytest.raises(urllib.error.HTTPError) as caught:
                _raw_get(base, path)
            assert caught.value.code == 404, path
        assert (mirror / "keys/pubring.kbx").is_file()  # it is there, just never served
    finally:
        server.shutdown()


def test_the_cli_prints_the_apt_block_to_paste(tmp_path, archive, monkeypatch, capsys):
    from p40fleet.mirror import __main__ as cli
    from p40fleet.spec.load import load_spec

    monkeypatch.setattr(cli, "fleet_of", lambda inventory: ([], []))
    mirror = tmp_path / "mirror"
    code = cli.main(["build", str(mirror), "--quiet", "--base-url", "http://10.0.0.5:8111",
                     "--kernel", KERNEL, "--apt-upstream", archive["base"],
                     "--apt-suite", "focal", "--apt-suite", "focal-updates",
                     "--apt-component", "main",
                     "--upstream-keyring", str(archive["ring"])])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"  apt       {len(CLOSURE) + 6:5} files" in out
    block = json.loads(out.split('stack["mirror"] = ', 1)[1])
    assert block["apt"]["signed_by"] == str((mirror / "apt/p40fleet-mirror.gpg").resolve())
    spec = load_spec("h", {"mirror": block})  # validates: signed_by exists, no trusted
    assert spec.mirror.apt.signed_by == block["apt"]["signed_by"] and not spec.mirror.apt.trusted
    from p40fleet.operations.mirror import source_line

    line = source_line(spec.mirror.apt.url, spec.mirror.apt.suite, spec.mirror.apt.components,
                       spec.mirror.apt.signed_by, spec.mirror.apt.trusted)  # fmt: skip
    assert line == ("deb [signed-by=/etc/apt/keyrings/p40fleet-mirror.gpg] "
                    "http://10.0.0.5:8111/apt focal main")  # fmt: skip


def test_the_cli_refuses_a_missing_keyring_and_an_unchecked_http_upstream(
    tmp_path, archive, monkeypatch, capsys
):
    from p40fleet.mirror import __main__ as cli

    monkeypatch.setattr(cli, "fleet_of", lambda inventory: ([], []))
    common = ["build", str(tmp_path / "m"), "--quiet", "--kernel", KERNEL,
              "--apt-upstream", archive["base"], "--apt-component", "main"]  # fmt: skip
    assert cli.main([*common, "--upstream-keyring", str(tmp_path / "nope.gpg")]) == 2
    assert "nope.gpg: no such file" in capsys.readouterr().err
    assert cli.main(common) == 1
    err = capsys.readouterr().err
    assert "plain-http upstream and no --upstream-keyring" in err and "MISSING apt:" in err
    assert not (tmp_path / "m/apt").exists()


# -- a flat upstream (Debian's "Flat Repository Format": deb URL ./) ---------------------------


def _flat_release(index: dict[str, bytes], hashes: tuple[str, ...] = ("MD5Sum", "SHA256")) -> str:
    """A flat repository's Release as p40lab/apt.py writes one (no Suite, no Components),
    listing ``index`` under each of ``hashes``."""
    lines = ["Origin: fake flat", "Label: fake flat", f"Date: {formatdate(usegmt=True)}"]
    for field in hashes:
        algorithm = {"MD5Sum": hashlib.md5, "SHA256": hashlib.sha256}[field]
        lines.append(f"{field}:")
        lines += [f" {algorithm(d).hexdigest()} {len(d)} {p}" for p, d in sorted(index.items())]
    return "\n".join(lines) + "\n"


def _sign_flat(flat: Path, release: str, home: Path) -> None:
    """Write ``release`` as ``flat``'s Release, with its Release.gpg and InRelease."""
    (flat / "Release").write_text(release)
    for path in ("Release.gpg", "InRelease"):
        (flat / path).unlink(missing_ok=True)
    _gpg(home, "--armor", "--detach-sign", "--output", str(flat / "Release.gpg"),
         str(flat / "Release"))  # fmt: skip
    _gpg(home, "--clearsign", "--output", str(flat / "InRelease"), str(flat / "Release"))


@pytest.fixture(scope="module")
def flat(tmp_path_factory, archive):
    """UPSTREAM as one flat repository at BASE/flat: the .debs beside the Release
    (``Filename: ./NAME.deb``, libc6's in a subdirectory without ``./``), Packages and
    Packages.gz, a Release with MD5Sum and SHA256 (as the lab's), signed by the archive key."""
    tmp = tmp_path_factory.mktemp("flat")
    root, work = tmp / "upstream", tmp / "work"
    repo = root / "flat"
    stanzas, debs = [], {}
    for _suite, name, version, arch, fields in UPSTREAM:
        rel = f"debs/{name}_{version}_{arch}.deb" if name == "libc6" else \
            f"./{name}_{version}_{arch}.deb"  # fmt: skip
        deb = repo / rel
        text = _make_deb(work, deb, name, version, arch, fields)
        stanzas.append(_stanza(text, rel, deb.read_bytes()))
        debs[f"{name}_{version}"] = deb
    packages = "\n".join(stanzas).encode()
    (repo / "Packages").write_bytes(packages)
    (repo / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    index = {n: (repo / n).read_bytes() for n in ("Packages", "Packages.gz")}
    _sign_flat(repo, _flat_release(index), archive["home"])
    log = tmp / "flat-access.log"
    server, base = _serve(root, log)
    yield {"repo": repo, "url": f"{base}/flat", "base": base, "debs": debs, "log": log,
           "index": index, "ring": archive["ring"], "home": archive["home"]}  # fmt: skip
    server.shutdown()


def _flat_plan(flat, keyring: Path | None = None, **kw) -> AptPlan:
    upstream = apt_repo.Upstream(url=flat["url"], suites=("./",), keyring=keyring, **kw)
    return AptPlan(tuple(apt_repo.deploy_packages([KERNEL])), upstream,
                   base_url="http://10.0.0.5:8111")  # fmt: skip


def test_flat_build_mirrors_the_closure_and_a_second_build_fetches_nothing(tmp_path, flat):
    mirror = tmp_path / "mirror"
    before = len(_log_lines(flat["log"]))
    result = build(mirror, [], progress=False, apt=_flat_plan(flat, flat["ring"]))
    assert result.fetched["apt"][0] == len(CLOSURE)
    gets = _log_lines(flat["log"])[before:]
    assert any("/flat/InRelease " in g for g in gets), gets  # the flat Release, signed
    assert not any("/dists/" in g for g in gets), gets
    assert len([g for g in gets if ".deb " in g]) == len(CLOSURE)
    # the mirror is dists-style as for any upstream: suite focal, component main, .debs in pool/
    binary = mirror / "apt/dists/focal/main/binary-amd64"
    packages = {p["Package"]: p for p in paragraphs((binary / "Packages").read_text())}
    assert set(packages) == CLOSURE
    assert packages["make"]["Version"] == "4.2.1-1.2"  # the higher of the index's two
    assert packages["kmod"]["Filename"] == "pool/kmod_27-1ubuntu2_amd64.deb"
    assert packages["libc6"]["Filename"] == "pool/debs/libc6_2.31-0ubuntu9_amd64.deb"
    for stanza in packages.values():
        kept = mirror / "apt" / stanza["Filename"]
        upstream = flat["debs"][f"{stanza['Package']}_{stanza['Version']}"]
        assert kept.read_bytes() == upstream.read_bytes(), kept
    release = mirror / "apt/dists/focal/Release"
    key = mirror / "apt/p40fleet-mirror.gpg"
    subprocess.run(["gpgv", "--keyring", str(key), str(release.parent / "Release.gpg"),
                    str(release)], check=True, capture_output=True)  # fmt: skip
    assert result.apt is not None and result.apt["suite"] == "focal"
    assert result.apt["components"] == ["main"]
    assert verify(mirror)[0] == []

    signed = (release.parent / "InRelease").read_bytes()
    mark = len(_log_lines(flat["log"]))
    again = build(mirror, [], progress=False, apt=_flat_plan(flat, flat["ring"]))
    assert again.fetched == {}
    assert _log_lines(flat["log"])[mark:] == []  # not even the Release
    assert (release.parent / "InRelease").read_bytes() == signed


def test_flat_a_deb_whose_sum_differs_from_the_index_is_refused_and_named(tmp_path, flat):
    deb = flat["debs"]["kmod_27-1ubuntu2"]
    original = deb.read_bytes()
    deb.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    try:
        with pytest.raises(MirrorError) as caught:
            build(tmp_path / "mirror", [], progress=False, apt=_flat_plan(flat, flat["ring"]))
    finally:
        deb.write_bytes(original)
    text = str(caught.value)
    assert "apt ./kmod_27-1ubuntu2_amd64.deb: " in text and "is not the pinned" in text
    assert "the repository index is not written" in text
    assert not (tmp_path / "mirror/apt/pool/kmod_27-1ubuntu2_amd64.deb").exists()
    assert not (tmp_path / "mirror/apt/dists").exists()
    assert (tmp_path / "mirror/apt/pool/make_4.2.1-1.2_amd64.deb").is_file()  # the rest


def test_flat_an_index_whose_sum_differs_from_the_release_is_refused(tmp_path, flat):
    index = flat["repo"] / "Packages.gz"
    index.write_bytes(_flip_middle_byte(flat["index"]["Packages.gz"]))
    try:
        with pytest.raises(MirrorError, match="flat/Packages.gz: sha256 .* is not the pinned"):
            build(tmp_path / "mirror", [], progress=False, apt=_flat_plan(flat, flat["ring"]))
    finally:
        index.write_bytes(flat["index"]["Packages.gz"])
    assert not list((tmp_path / "mirror").rglob("*.deb"))


def test_flat_a_release_with_md5_only_or_no_sum_needs_allow_unverified(tmp_path, flat):
    """SHA256 when the Release lists it (the MD5Sum checked too); MD5Sum only, or no sum, is
    refused unless allow_unverified, and then said in a note (checked against the MD5)."""
    repo, home, ring = flat["repo"], flat["home"], flat["ring"]
    original = {n: (repo / n).read_bytes() for n in ("Release", "Release.gpg", "InRelease")}
    try:
        # the SHA256 matches but the MD5Sum does not: refused all the same
        bad_md5 = _flat_release(flat["index"]).replace(
            hashlib.md5(flat["index"]["Packages.gz"]).hexdigest(), "0" * 32)  # fmt: skip
        _sign_flat(repo, bad_md5, home)
        with pytest.raises(MirrorError, match="Packages.gz: md5 .* is not the pinned 0{32}"):
            build(tmp_path / "m0", [], progress=False, apt=_flat_plan(flat, ring))
        _sign_flat(repo, _flat_release(flat["index"], ("MD5Sum",)), home)
        with pytest.raises(MirrorError, match="Packages.gz with an MD5Sum only .*allow-unver"):
            build(tmp_path / "m1", [], progress=False, apt=_flat_plan(flat, ring))
        assert not (tmp_path / "m1/apt").exists()
        _, notes = apt_repo.read_indexes(tmp_path / "m2", _flat_plan(
            flat, ring, allow_unverified=True).upstream)  # fmt: skip
        assert notes == [f"{flat['url']}/Packages.gz: checked against the Release's MD5Sum "
                         "only (no SHA256)"]  # fmt: skip
        (repo / "Packages.gz").write_bytes(gzip.compress(b"Package: x\n", mtime=0))
        try:  # and that MD5 is checked
            with pytest.raises(FetchError, match="Packages.gz: md5 .* is not the pinned"):
                apt_repo.read_indexes(tmp_path / "m3", _flat_plan(
                    flat, ring, allow_unverified=True).upstream)  # fmt: skip
        finally:
            (repo / "Packages.gz").write_bytes(flat["index"]["Packages.gz"])
        _sign_flat(repo, _flat_release(flat["index"], ()), home)
        with pytest.raises(MirrorError, match="lists no SHA256 \\(nor MD5Sum\\) of a Packages"):
            build(tmp_path / "m4", [], progress=False, apt=_flat_plan(flat, ring))
        unchecked = build(tmp_path / "m5", [], progress=False,
                          apt=_flat_plan(flat, ring, allow_unverified=True))  # fmt: skip
        assert unchecked.fetched["apt"][0] == len(CLOSURE)
    finally:
        for name, data in original.items():
            (repo / name).write_bytes(data)


def test_flat_the_release_signature_is_checked(tmp_path, flat, archive):
    with pytest.raises(MirrorError, match="flat/InRelease: the signature does not verify"):
        build(tmp_path / "m1", [], progress=False, apt=_flat_plan(flat, archive["other"]))
    with pytest.raises(MirrorError, match="plain-http upstream and no --upstream-keyring"):
        build(tmp_path / "m2", [], progress=False, apt=_flat_plan(flat))
    assert not list(tmp_path.rglob("*.deb"))


def test_flat_suite_and_filename_may_not_leave_the_repository():
    with pytest.raises(AptError, match="without '..'"):
        apt_repo.flat_dir("../")
    assert [apt_repo.flat_dir(s) for s in ("./", "/", "sub/", "focal")] == ["", "", "sub", None]
    package = Package({"Package": "p", "Version": "1", "Filename": "./../p.deb"}, "u", flat=True)
    with pytest.raises(AptError, match="no relative path inside"):
        apt_repo._pool_path(package)
    dists = Package({"Package": "p", "Version": "1", "Filename": "./p.deb"}, "u")
    with pytest.raises(AptError, match="no relative path inside"):  # as before: dists-style
        apt_repo._pool_path(dists)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("apt-get"), reason="apt-get as root")
def test_apt_get_accepts_a_mirror_of_a_flat_upstream_signed_by_its_key(tmp_path, flat):
    # the fixture is a flat repository as apt reads one (deb URL ./, Filename relative to URL)
    upstream = f"deb [signed-by={flat['ring']}] {flat['url']} ./\n"
    direct = _apt_get(tmp_path / "direct", upstream, "update")
    assert direct.returncode == 0 and "W:" not in direct.stdout + direct.stderr, direct.stdout
    direct = _apt_get(tmp_path / "direct", upstream, "install", "-y", "--download-only",
                      "--no-install-recommends", "libc6")  # fmt: skip
    assert direct.returncode == 0, direct.stdout + direct.stderr  # debs/libc6_...deb
    mirror = tmp_path / "mirror"
    block = build(mirror, [], progress=False, apt=_flat_plan(flat, flat["ring"])).apt
    assert block is not None
    server, base = _serve(mirror, tmp_path / "mirror-access.log")
    try:
        line = (f"deb [signed-by={block['signed_by']}] {base}/apt {block['suite']} "
                f"{' '.join(block['components'])}\n")  # fmt: skip
        update = _apt_get(tmp_path / "ok", line, "update")
        out = update.stdout + update.stderr
        assert update.returncode == 0 and "W:" not in out, out
        got = _apt_get(tmp_path / "ok", line, "install", "-y", "--download-only",
                       "--no-install-recommends", *apt_repo.deploy_packages([KERNEL]))  # fmt: skip
        assert got.returncode == 0, got.stdout + got.stderr
        fetched = {p.name.split("_")[0] for p in (tmp_path / "ok/cache/archives").glob("*.deb")}
        assert fetched == CLOSURE
    finally:
        server.shutdown()


def test_the_cli_reads_a_flat_upstream_and_refuses_components_for_it(
    tmp_path, flat, monkeypatch, capsys
):
    from p40fleet.mirror import __main__ as cli

    monkeypatch.setattr(cli, "fleet_of", lambda inventory: ([], []))
    common = ["build", str(tmp_path / "m"), "--quiet", "--kernel", KERNEL,
              "--apt-upstream", flat["url"], "--apt-suite", "./",
              "--upstream-keyring", str(flat["ring"])]  # fmt: skip
    assert cli.main([*common, "--apt-component", "main"]) == 2
    err = capsys.readouterr().err
    assert "--apt-component main: a flat upstream (--apt-suite ./) has no components" in err
    assert not (tmp_path / "m").exists()
    assert cli.main(common) == 0
    out = capsys.readouterr().out
    block = json.loads(out.split('stack["mirror"] = ', 1)[1])
    assert block["apt"]["suite"] == "focal" and block["apt"]["components"] == ["main"]


def test_the_builder_reads_a_flat_repository_written_by_the_labs_writer(tmp_path):
    """p40lab/apt.py's own repository (its Release unsigned, MD5Sum and SHA256, ``./`` file
    names), the packages it gets from Debian stood in by tiny .debs: the deploy's closure."""
    lab_apt = pytest.importorskip("p40lab.apt")
    work = tmp_path / "work"
    extra = [("kmod", "27-1", {}), ("make", "4.2.1-1.2", {}),
             ("fakecc", "1.0", {"Provides": "c-compiler"}), ("build-essential", "12.8", {}),
             ("pkg-config", "0.29.1", {}), ("libglvnd-dev", "1.3.1-1", {})]  # fmt: skip
    debian = []
    for name, version, fields in extra:
        deb = work / "debian" / f"{name}.deb"
        _make_deb(work / "trees", deb, name, version, "amd64", fields)
        debian.append(deb)
    root = tmp_path / "lab"
    lab_apt.build_apt(root / "apt", KERNEL, work, debian)
    release = (root / "apt/Release").read_text()
    assert "SHA256:" in release and "Suite:" not in release  # what the lab writes, as assumed
    log = tmp_path / "lab-access.log"
    server, base = _serve(root, log)
    try:
        upstream = apt_repo.Upstream(url=f"{base}/apt", suites=("./",), allow_unverified=True)
        plan = AptPlan(tuple(apt_repo.deploy_packages([KERNEL])), upstream)
        result = build(tmp_path / "mirror", [], progress=False, apt=plan)
    finally:
        server.shutdown()
    want = {"dkms", f"linux-headers-{KERNEL}", *(name for name, _, _ in extra)}
    packages = paragraphs((tmp_path / "mirror/apt/dists/focal/main/binary-amd64/Packages")
                          .read_text())  # fmt: skip
    assert {p["Package"] for p in packages} == want
    for stanza in packages:
        kept = tmp_path / "mirror/apt" / stanza["Filename"]
        assert kept.read_bytes() == (root / "apt" / kept.name).read_bytes()
    assert result.apt is not None and verify(tmp_path / "mirror")[0] == []
