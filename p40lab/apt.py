"""The lab's flat apt repository (``apt/`` of the mirror): ``linux-headers-<uname -r>`` and
``build-essential`` doubles, with ``Packages``, ``Packages.gz`` and ``Release``."""

from __future__ import annotations

import gzip
import hashlib
import shutil
import subprocess
from email.utils import formatdate
from pathlib import Path


def _deb(work: Path, name: str, version: str, files: dict[str, str], links: dict[str, str],
         depends: str = "", arch: str = "amd64", desc: str = "") -> Path:  # fmt: skip
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
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
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


def build_apt(apt_dir: Path, kernel_release: str, work: Path) -> None:
    apt_dir.mkdir(parents=True, exist_ok=True)
    kr = kernel_release
    src = f"usr/src/linux-headers-{kr}"
    major, minor = (kr.split(".") + ["0"])[:2]
    debs = [
        _deb(
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
        ),
        _deb(
            work,
            "build-essential",
            "12.9+p40lab1",
            {"usr/share/doc/build-essential/list": "gcc\nmake\nlibc6-dev\n"},
            {},
            depends="gcc, make, libc6-dev | libc-dev",
            desc="Informational list of build-essential packages",
        ),
    ]
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
