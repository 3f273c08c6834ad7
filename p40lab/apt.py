"""The lab's flat apt repository (``apt/`` of the mirror), with ``Packages``, ``Packages.gz`` and
``Release``. A lab host's image has no compiler, no dkms and no pkg-config (as a stock Ubuntu
20.04 server); this repo serves what the deploy installs:

* ``build-essential``, ``pkg-config``, ``libglvnd-dev`` and what they need beyond the base image:
  the real Debian packages, downloaded from Debian's archive (:func:`fetch_debian`, cached);
* ``dkms``: a double (:data:`p40lab.doubles` ``dkms``) with the kernel hooks
  ``/etc/kernel/postinst.d/dkms`` and ``/etc/kernel/header_postinst.d/dkms``;
* ``linux-headers-<R>`` for the running kernel and for :func:`second_kernel`, whose postinst
  runs ``/etc/kernel/header_postinst.d`` (dkms rebuilds its modules for ``R`` there);
* ``linux-image-<second_kernel>``: the "kernel update" (postinst: ``/etc/kernel/postinst.d``,
  then it is the kernel the host boots next, :data:`BOOT_DEFAULT`, as update-grub makes it).
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
import subprocess
from email.utils import formatdate
from pathlib import Path

from p40lab import doubles
from p40lab.boot import BOOT_DEFAULT

#: Real Debian packages the repo serves (with their dependency closure over the base image).
DEBIAN_PACKAGES = ("build-essential", "pkg-config", "libglvnd-dev")
DEBIAN_ARCHIVE = "http://deb.debian.org/debian"
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
DKMS_VERSION = "2.8.1-5ubuntu2+p40lab1"

DKMS_HOOK = """\
#!/bin/sh
# p40lab double of dkms's kernel hook (dkms_autoinstaller start KVER): build and install every
# AUTOINSTALL module for the kernel (or headers) just installed. Never fails the package.
inst_kern=${1:-}
[ -n "$inst_kern" ] || exit 0
if ! /usr/sbin/dkms autoinstall -k "$inst_kern"; then
    echo "dkms: WARNING: Linux headers are missing, which may explain the above failures." >&2
    echo "      please install the linux-headers-$inst_kern package to fix this." >&2
fi
exit 0
"""


def second_kernel(kernel_release: str) -> str:
    """The release a lab host's "kernel update" brings (``linux-image-<it>`` in the repo)."""
    return f"{kernel_release}-p40lab2"


def _run_parts(directory: str, *args: str) -> str:
    quoted = " ".join(f"--arg={a}" for a in args)
    return f"if [ -d {directory} ]; then run-parts --report {quoted} {directory}; fi\n"


def _deb(work: Path, name: str, version: str, files: dict[str, str], links: dict[str, str],
         depends: str = "", arch: str = "amd64", desc: str = "", executables: tuple = (),
         postinst: str = "") -> Path:  # fmt: skip
    root = work / f"deb-{name}"
    shutil.rmtree(root, ignore_errors=True)
    (root / "DEBIAN").mkdir(parents=True)
    control = [
        f"Package: {name}",
        f"Version: {version}",
        f"Architecture: {arch}",
        "Maintainer: p40lab <p40lab@localhost>",
        "Section: devel",
        "Priority: optional",
    ]
    if depends:
        control.append(f"Depends: {depends}")
    control.append(f"Description: {desc or name} (p40lab double)")
    (root / "DEBIAN/control").write_text("\n".join(control) + "\n")
    if postinst:
        (root / "DEBIAN/postinst").write_text(f"#!/bin/sh\nset -e\n{postinst}exit 0\n")
        (root / "DEBIAN/postinst").chmod(0o755)
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        p.chmod(0o755 if rel in executables else 0o644)
    for rel, target in links.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.symlink_to(target)
    out = work / f"{name}_{version}_{arch}.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)],
        check=True, capture_output=True,
    )  # fmt: skip
    return out


def _headers(work: Path, kr: str) -> Path:
    src = f"usr/src/linux-headers-{kr}"
    major, minor = (kr.split(".") + ["0"])[:2]
    return _deb(
        work,
        f"linux-headers-{kr}".lower(),
        "1.0+p40lab1",
        {
            f"{src}/Makefile": f"# p40lab placeholder of the kernel build Makefile\n"
            f"VERSION = {major}\nPATCHLEVEL = {''.join(c for c in minor if c.isdigit())}\n"
            f"KERNELRELEASE = {kr}\n",
            f"{src}/.config": "# p40lab placeholder\nCONFIG_MODULES=y\nCONFIG_X86_64=y\n",
            f"{src}/Module.symvers": "",
            f"{src}/include/generated/utsrelease.h": f'#define UTS_RELEASE "{kr}"\n',
            f"{src}/include/config/kernel.release": f"{kr}\n",
        },
        {f"lib/modules/{kr}/build": f"/{src}"},
        desc=f"Header files related to Linux kernel version {kr}",
        postinst=_run_parts("/etc/kernel/header_postinst.d", kr, f"/{src}"),
    )


def _image(work: Path, kr: str) -> Path:
    mods = f"lib/modules/{kr}"
    return _deb(
        work,
        f"linux-image-{kr}".lower(),
        "1.0+p40lab1",
        {
            f"boot/vmlinuz-{kr}": f"p40lab placeholder of the kernel image {kr}\n",
            f"{mods}/modules.order": "",
            f"{mods}/modules.builtin": "",
            f"{mods}/modules.builtin.modinfo": "",
        },
        {},
        desc=f"Linux kernel image for version {kr} (the lab's kernel update)",
        postinst=_run_parts("/etc/kernel/postinst.d", kr, f"/boot/vmlinuz-{kr}")
        + f"echo {kr} > /{BOOT_DEFAULT}\n",
    )


def _dkms(work: Path) -> Path:
    return _deb(
        work,
        "dkms",
        DKMS_VERSION,
        {
            "usr/sbin/dkms": doubles.source("dkms"),
            "etc/kernel/postinst.d/dkms": DKMS_HOOK,
            "etc/kernel/header_postinst.d/dkms": DKMS_HOOK,
        },
        {},
        depends="kmod, gcc | c-compiler, make",
        arch="all",
        desc="Dynamic Kernel Module Support Framework",
        executables=(
            "usr/sbin/dkms",
            "etc/kernel/postinst.d/dkms",
            "etc/kernel/header_postinst.d/dkms",
        ),
    )


def fetch_debian(
    packages: tuple[str, ...], base_status: Path, cache: Path, suite: str = "bookworm"
) -> list[Path]:
    """Download ``packages`` and everything they need that the base image (its dpkg status
    file ``base_status``) lacks, from Debian's archive, into ``cache`` (kept between builds).
    apt on the controller resolves them against the base's status, as the host's apt will."""
    if not base_status.is_file():
        raise RuntimeError(f"no dpkg status at {base_status}: build the base first")
    root = cache.resolve()
    for d in ("lists/partial", "archives/partial", "etc"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "etc/sources.list").write_text(
        f"deb [signed-by={DEBIAN_KEYRING}] {DEBIAN_ARCHIVE} {suite} main\n"
    )
    opts = [
        f"-oDir::State::status={base_status}",
        f"-oDir::State::Lists={root}/lists",
        f"-oDir::State::extended_states={root}/extended_states",
        f"-oDir::Cache={root}",
        f"-oDir::Cache::archives={root}/archives",
        f"-oDir::Etc::SourceList={root}/etc/sources.list",
        "-oDir::Etc::SourceParts=/nonexistent",
        "-oDir::Etc::Preferences=/nonexistent",
        "-oDir::Etc::PreferencesParts=/nonexistent",
        "-oAPT::Architecture=amd64",
        "-oAPT::Install-Recommends=false",
        "-oDebug::NoLocking=true",
        "-oAcquire::Retries=3",
    ]
    for args in (["update"], ["install", "-y", "--download-only", *packages]):
        proc = subprocess.run(["apt-get", "-q", *opts, *args], capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
            raise RuntimeError(f"apt-get {args[0]} from {DEBIAN_ARCHIVE} failed: {tail}")
    debs = sorted((root / "archives").glob("*.deb"))
    if not debs:
        raise RuntimeError(f"apt-get downloaded nothing for {' '.join(packages)}")
    return debs


def _field(deb: Path, name: str) -> str:
    out = subprocess.run(["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True)
    return out.stdout.strip()


def build_apt(apt_dir: Path, kernel_release: str, work: Path, debian_debs: list[Path] = ()) -> None:
    """The repo for a lab whose hosts run ``kernel_release``; ``debian_debs`` from
    :func:`fetch_debian` (none: a repo without compilers, for the unit tests)."""
    apt_dir.mkdir(parents=True, exist_ok=True)
    kr = kernel_release
    kr2 = second_kernel(kr)
    debs = [_headers(work, kr), _headers(work, kr2), _image(work, kr2), _dkms(work)]
    for deb in debian_debs:
        # filenames without the epoch's ':' (served as is over HTTP)
        name = f"{_field(deb, 'Package')}_{_field(deb, 'Version').split(':')[-1]}_"
        name += f"{_field(deb, 'Architecture')}.deb"
        debs.append(work / name)
        shutil.copyfile(deb, work / name)
    stanzas = []
    for deb in debs:
        shutil.copyfile(deb, apt_dir / deb.name)
        ctrl = subprocess.run(
            ["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True
        ).stdout.strip()
        data = deb.read_bytes()
        stanzas.append(
            f"{ctrl}\nFilename: ./{deb.name}\nSize: {len(data)}\n"
            f"MD5sum: {hashlib.md5(data).hexdigest()}\nSHA256: {hashlib.sha256(data).hexdigest()}\n"
        )
    packages = ("\n".join(stanzas)).encode()
    (apt_dir / "Packages").write_bytes(packages)
    with gzip.GzipFile(apt_dir / "Packages.gz", "wb", mtime=0) as gz:
        gz.write(packages)
    rel = ["Origin: p40lab", "Label: p40lab", f"Date: {formatdate(usegmt=True)}", "MD5Sum:"]
    idx = ("Packages", "Packages.gz")
    for f in idx:
        b = (apt_dir / f).read_bytes()
        rel.append(f" {hashlib.md5(b).hexdigest()} {len(b)} {f}")
    rel.append("SHA256:")
    for f in idx:
        b = (apt_dir / f).read_bytes()
        rel.append(f" {hashlib.sha256(b).hexdigest()} {len(b)} {f}")
    (apt_dir / "Release").write_text("\n".join(rel) + "\n")
