"""The lab's artifact mirror: builds the installer doubles and serves them over HTTP.

Layout of the mirror dir (``$P40LAB_CACHE/mirror``, default ``/var/cache/p40lab/mirror``; other
modules add ``simple/``, ``wheels/``, ``git/`` beside; this module owns ``artifacts/`` and
``apt/`` only)::

    artifacts/NVIDIA-Linux-x86_64-525.147.05.run       driver double (makeself-style, sh FILE)
    artifacts/NVIDIA-Linux-x86_64-525.125.06.run       older R525 driver (upgrade tests)
    artifacts/cuda_11.8.0_520.61.05_linux.run          CUDA runfile double (+ driver 520.61.05)
    artifacts/cudnn-linux-x86_64-8.9.7.29_cuda11-archive.tar.xz   real tar.xz, deterministic
    artifacts/Miniconda3-py310_24.11.1-0-Linux-x86_64.sh            installer double (no ToS plugin)
    artifacts/Miniconda3-py310_25.5.1-0-Linux-x86_64.sh             same, conda has `conda tos`
    artifacts/SHA256SUMS                               sha256sum format
    apt/{Packages,Packages.gz,Release,*.deb}           flat repo: linux-headers-<uname -r>,
                                                       build-essential
    .p40lab-doubles.json                               stamp + pins (cache)

Served at ``http://10.231.0.1:8111/`` (document root = mirror dir) by ``python -m p40lab.mirror
serve``, which logs one line per request with the bytes sent to
``/var/lib/p40lab/mirror-access.log``.

CLI: ``python -m p40lab.mirror build [--force] [--dir D] | serve --dir D [--bind A] [--port P] |
start | stop | bytes | corrupt NAME | restore NAME``.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from email.utils import formatdate
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from p40lab import doubles
from p40lab import state as _lab

BUILD_VERSION = "1"
# This lab instance's (p40lab.state: $P40LAB_INSTANCE), so one instance never serves, stops or
# corrupts another's mirror.
LAB_DIR = _lab.LAB_DIR
CACHE_DIR = _lab.CACHE_DIR
MIRROR_DIR = _lab.MIRROR_DIR
PID_FILE = LAB_DIR / "mirror.pid"
ACCESS_LOG = LAB_DIR / "mirror-access.log"
SERVER_LOG = LAB_DIR / "mirror-server.log"
BIND = _lab.CONTROLLER_IP
PORT = _lab.MIRROR_PORT
BASE_URL = f"http://{BIND}:{PORT}"
STAMP_FILE = ".p40lab-doubles.json"
ORIG_DIR = ".p40lab-orig"  # pristine copies of corrupted artifacts (not under a served path)

DRIVER_VERSION = "525.147.05"
EXTRA_DRIVER_VERSIONS = ("525.125.06",)
CUDA_VERSION = "11.8.0"
CUDA_DRIVER = "520.61.05"  # the driver bundled in cuda_11.8.0_520.61.05_linux.run
CUDNN_VERSION = "8.9.7.29"
MINICONDA_VERSION = "py310_24.11.1-0"
CONDA_VERSION = "24.11.1"
# A later Miniconda that bundles the conda-anaconda-tos plugin (from 25.5.1 on): an extra
# artifact, for tests of the ToS decision against an installed conda that has `conda tos`.
MINICONDA_TOS_VERSION = "py310_25.5.1-0"
CONDA_TOS_VERSION = "25.5.1"
# The real cuda_11.8.0_520.61.05_linux.run is 4336730777 bytes (~4.3 GB) and unpacks into
# --tmpdir (default /tmp); the double demands that much free space unless the lab overrides it
# (env P40LAB_CUDA_UNPACK_BYTES at mirror build time sets the baked default, at run time on the
# host it overrides it).
CUDA_UNPACK_BYTES_REAL = 4336730777
FIXED_MTIME = 1700000000  # 2023-11-14: deterministic archives


def driver_filename(version: str) -> str:
    return f"NVIDIA-Linux-x86_64-{version}.run"


CUDA_FILENAME = f"cuda_{CUDA_VERSION}_{CUDA_DRIVER}_linux.run"
CUDNN_TOP = f"cudnn-linux-x86_64-{CUDNN_VERSION}_cuda11-archive"
CUDNN_FILENAME = f"{CUDNN_TOP}.tar.xz"


def miniconda_filename(version: str) -> str:
    return f"Miniconda3-{version}-Linux-x86_64.sh"


MINICONDA_FILENAME = miniconda_filename(MINICONDA_VERSION)
MINICONDA_TOS_FILENAME = miniconda_filename(MINICONDA_TOS_VERSION)


def log(msg: str) -> None:
    print(f"[p40lab.mirror {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fill(template: str, **values: Any) -> str:
    for k, v in values.items():
        template = template.replace(f"@{k}@", str(v))
    return template


# ---------------------------------------------------------------------------- ELF objects (gcc)


def _gcc(args: list[str], code: str, work: Path) -> None:
    src = work / "src.c"
    src.write_text(code)
    proc = subprocess.run(["gcc", *args, str(src)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"gcc {' '.join(args)} failed: {proc.stderr}")


def kernel_module(name: str, version: str, kernel_release: str, work: Path) -> bytes:
    """A relocatable ELF (what a .ko is) whose .modinfo section carries the real fields, so
    kmod's real ``modinfo``/``depmod`` read it."""
    fields = [
        f"version={version}",
        "supported=external",
        "license=NVIDIA",
        f"firmware=nvidia/{version}/gsp_tu10x.bin",
        f"firmware=nvidia/{version}/gsp_ad10x.bin",
        "alias=char-major-195-*",
        "alias=pci:v000010DEd*sv*sd*bc03sc02i00*",
        "alias=pci:v000010DEd*sv*sd*bc03sc00i00*",
        "depends=" + ("nvidia" if name != "nvidia" else ""),
        "retpoline=Y",
        f"name={name.replace('-', '_')}",
        f"vermagic={kernel_release} SMP mod_unload modversions ",
    ]
    code = "".join(
        f'static const char mi{i}[] __attribute__((section(".modinfo"), used, aligned(1)))'
        f' = "{f}";\n'
        for i, f in enumerate(fields)
    )
    out = work / f"{name}.ko"
    _gcc(["-c", "-O0", "-o", str(out)], code, work)
    return out.read_bytes()


def shared_lib(soname: str, work: Path) -> bytes:
    """A tiny real ELF shared object with the given SONAME (ldconfig/ldd accept it)."""
    out = work / "lib.so"
    sym = "p40lab_" + "".join(c if c.isalnum() else "_" for c in soname)
    _gcc(
        ["-shared", "-fPIC", "-O2", "-s", f"-Wl,-soname,{soname}", "-o", str(out)],
        f'const char *{sym}(void) {{ return "{soname} (p40lab double)"; }}\n',
        work,
    )
    return out.read_bytes()


# ---------------------------------------------------------------------------- archives


class Tree:
    """An in-memory file tree -> deterministic tar (sorted, fixed mtime, root-owned)."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[str, bytes | str, int]] = {}

    def file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self.entries[path] = ("f", data.encode() if isinstance(data, str) else data, mode)

    def link(self, path: str, target: str) -> None:
        self.entries[path] = ("l", target, 0o777)

    def files(self) -> list[str]:
        return sorted(self.entries)

    def tar_bytes(self, top: str = "", compress: str = "gz") -> bytes:
        raw = io.BytesIO()
        dirs: set[str] = set()
        for p in self.entries:
            parts = (f"{top}/{p}" if top else p).split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
            items = [(d, None) for d in dirs] + [
                (f"{top}/{p}" if top else p, e) for p, e in self.entries.items()
            ]
            for name, e in sorted(items, key=lambda x: x[0]):
                ti = tarfile.TarInfo(name)
                ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = FIXED_MTIME, 0, 0, "root", "root"
                if e is None:
                    ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(ti)
                elif e[0] == "l":
                    ti.type, ti.linkname, ti.mode = tarfile.SYMTYPE, e[1], 0o777
                    tar.addfile(ti)
                else:
                    ti.size, ti.mode = len(e[1]), e[2]
                    tar.addfile(ti, io.BytesIO(e[1]))
        data = raw.getvalue()
        if compress == "gz":
            out = io.BytesIO()
            with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=6) as gz:
                gz.write(data)
            return out.getvalue()
        if compress == "xz":
            return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=6)
        return data

    def size_kb(self) -> int:
        return sum(len(e[1]) for e in self.entries.values() if e[0] == "f") // 1024 + 1


def makeself(
    tree: Tree,
    *,
    label: str,
    script: str,
    targetname: str,
    req_bytes: int = 0,
    req_env: str = "",
) -> bytes:
    payload = tree.tar_bytes()
    header = fill(
        doubles.source("makeself-header.sh"),
        LABEL=label,
        SCRIPT=script,
        TARGETNAME=targetname,
        MD5=hashlib.md5(payload).hexdigest(),
        USIZE_KB=tree.size_kb(),
        REQ_BYTES=req_bytes,
        REQ_ENV=req_env,
        DATE=formatdate(FIXED_MTIME, usegmt=True),
    )
    skip = header.count("\n") + 1
    header = header.replace("@SKIP@", str(skip))
    return header.encode() + payload


# ---------------------------------------------------------------------------- the doubles


def build_driver(version: str, kernel_release: str, work: Path) -> bytes:
    tree = Tree()
    tree.file(
        "nvidia-installer", fill(doubles.source("nvidia-installer.sh"), VERSION=version), 0o755
    )
    tree.file("nvidia-smi", fill(doubles.source("nvidia-smi.py"), VERSION=version), 0o755)
    for mod in ("nvidia", "nvidia-modeset", "nvidia-drm", "nvidia-uvm"):
        tree.file(f"kernel/{mod}.ko", kernel_module(mod, version, kernel_release, work))
    tree.file(f"libnvidia-ml.so.{version}", shared_lib("libnvidia-ml.so.1", work), 0o755)
    tree.file(".version", version + "\n")
    return makeself(
        tree,
        label=f"NVIDIA Accelerated Graphics Driver for Linux-x86_64 {version}",
        script="nvidia-installer",
        targetname=f"NVIDIA-Linux-x86_64-{version}",
    )


def _version_json() -> str:
    comps = {
        "cuda": ("CUDA SDK", "11.8.20220929"),
        "cuda_cccl": ("CUDA C++ Core Compute Libraries", "11.8.89"),
        "cuda_cudart": ("CUDA Runtime (cudart)", "11.8.89"),
        "cuda_cuobjdump": ("cuobjdump", "11.8.86"),
        "cuda_cupti": ("CUPTI", "11.8.87"),
        "cuda_cuxxfilt": ("CUDA cu++ filt", "11.8.86"),
        "cuda_gdb": ("CUDA GDB", "11.8.86"),
        "cuda_nvcc": ("CUDA NVCC", "11.8.89"),
        "cuda_nvdisasm": ("CUDA nvdisasm", "11.8.86"),
        "cuda_nvml_dev": ("CUDA NVML Headers", "11.8.86"),
        "cuda_nvprune": ("CUDA nvprune", "11.8.86"),
        "cuda_nvrtc": ("CUDA NVRTC", "11.8.89"),
        "cuda_nvtx": ("CUDA NVTX", "11.8.86"),
        "libcublas": ("CUDA cuBLAS", "11.11.3.6"),
        "libcufft": ("CUDA cuFFT", "10.9.0.58"),
        "libcurand": ("CUDA cuRAND", "10.3.0.86"),
        "libcusolver": ("CUDA cuSOLVER", "11.4.1.48"),
        "libcusparse": ("CUDA cuSPARSE", "11.7.5.86"),
        "nvidia_driver": ("NVIDIA Linux Driver", CUDA_DRIVER),
    }
    data = {k: {"name": n, "version": v} for k, (n, v) in comps.items()}
    return json.dumps(data, indent=3, separators=(",", " : ")) + "\n"


CUDA_LIBS = [  # (real file, soname) under targets/x86_64-linux/lib
    ("libcudart.so.11.8.89", "libcudart.so.11.0"),
    ("libcublas.so.11.11.3.6", "libcublas.so.11"),
    ("libcublasLt.so.11.11.3.6", "libcublasLt.so.11"),
    ("libcufft.so.10.9.0.58", "libcufft.so.10"),
    ("libcurand.so.10.3.0.86", "libcurand.so.10"),
    ("libcusparse.so.11.7.5.86", "libcusparse.so.11"),
    ("libnvrtc.so.11.8.89", "libnvrtc.so.11.2"),
]


def build_cuda(kernel_release: str, work: Path, unpack_bytes: int) -> bytes:
    t = Tree()
    tk = "toolkit"
    t.file(f"{tk}/bin/nvcc", fill(doubles.source("nvcc.sh"), CUDA_SHORT="11.8"), 0o755)
    t.file(
        f"{tk}/bin/nvcc.profile",
        "\nTOP              = $(_HERE_)/..\n\nNVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice\n\n"
        "LD_LIBRARY_PATH += $(TOP)/lib:\nPATH            += $(TOP)/nvvm/bin:$(_HERE_):\n\n"
        'INCLUDES        +=  "-I$(TOP)/$(_TARGET_DIR_)/include" $(_SPACE_)\n\n'
        'LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/$(_TARGET_DIR_)/lib$(_TARGET_SIZE_)/stubs"'
        ' "-L$(TOP)/$(_TARGET_DIR_)/lib$(_TARGET_SIZE_)"\n',
    )
    t.file(
        f"{tk}/bin/cuda-uninstaller",
        "#!/bin/sh\n# p40lab double: removes this toolkit installation\n"
        'top=$(cd "$(dirname "$0")/.." && pwd)\nrm -rf "$top"\n'
        'echo "Successfully uninstalled"\n',
        0o755,
    )
    inc = f"{tk}/targets/x86_64-linux/include"
    t.file(
        f"{inc}/cuda.h",
        "/* p40lab placeholder of cuda.h (CUDA 11.8) */\n#ifndef __cuda_cuda_h__\n"
        "#define __cuda_cuda_h__\n\n#define CUDA_VERSION 11080\n\n#endif\n",
    )
    t.file(
        f"{inc}/cuda_runtime_api.h",
        "/* p40lab placeholder of cuda_runtime_api.h (CUDA 11.8) */\n"
        "#if !defined(__CUDA_RUNTIME_API_H__)\n#define __CUDA_RUNTIME_API_H__\n\n"
        "#define CUDART_VERSION  11080\n\n#endif\n",
    )
    t.file(
        f"{inc}/cuda_runtime.h",
        "/* p40lab placeholder of cuda_runtime.h */\n#if !defined(__CUDA_RUNTIME_H__)\n"
        '#define __CUDA_RUNTIME_H__\n#include "cuda_runtime_api.h"\n#endif\n',
    )
    lib = f"{tk}/targets/x86_64-linux/lib"
    for real, soname in CUDA_LIBS:
        t.file(f"{lib}/{real}", shared_lib(soname, work), 0o755)
        t.link(f"{lib}/{soname}", real)
        t.link(f"{lib}/{soname.split('.so')[0]}.so", soname)
    t.link(f"{tk}/lib64", "targets/x86_64-linux/lib")
    t.link(f"{tk}/include", "targets/x86_64-linux/include")
    t.file(f"{tk}/nvvm/libdevice/libdevice.10.bc", b"p40lab placeholder\n")
    t.file(f"{tk}/doc/man/man1/nvcc.1", '.TH NVCC 1 "2022" "CUDA 11.8"\n')
    t.file(f"{tk}/EULA.txt", "p40lab placeholder of the CUDA EULA\n")
    t.file(f"{tk}/version.json", _version_json())
    t.file(
        f"builds/{driver_filename(CUDA_DRIVER)}",
        build_driver(CUDA_DRIVER, kernel_release, work),
        0o755,
    )
    nfiles = sum(1 for p in t.entries if p.startswith(f"{tk}/"))
    t.file(
        "cuda-installer",
        fill(
            doubles.source("cuda-installer.sh"),
            CUDA_VERSION=CUDA_VERSION,
            CUDA_SHORT="11.8",
            DRIVER_VERSION=CUDA_DRIVER,
            GCC_MAX=11,
            STEP_SLEEP=f"{2.5 / nfiles:.3f}",
        ),
        0o755,
    )
    return makeself(
        t,
        label="NVIDIA CUDA Toolkit",
        script="cuda-installer",
        targetname=f"cuda_{CUDA_VERSION}_{CUDA_DRIVER}_linux",
        req_bytes=unpack_bytes,
        req_env="P40LAB_CUDA_UNPACK_BYTES",
    )


CUDNN_SUBLIBS = ("adv_infer", "adv_train", "cnn_infer", "cnn_train", "ops_infer", "ops_train")


def cudnn_version_h(major: int = 8, minor: int = 9, patch: int = 7) -> str:
    return (
        "/* p40lab placeholder of cudnn_version.h (the real file starts with NVIDIA's licence\n"
        " * notice; the defines below have the real names and layout) */\n\n"
        "/**\n * \\file: The master cuDNN version file.\n */\n\n"
        "#ifndef CUDNN_VERSION_H_\n#define CUDNN_VERSION_H_\n\n"
        f"#define CUDNN_MAJOR {major}\n#define CUDNN_MINOR {minor}\n"
        f"#define CUDNN_PATCHLEVEL {patch}\n\n"
        "#define CUDNN_VERSION (CUDNN_MAJOR * 1000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL)\n\n"
        "/* cannot use constexpr here since this is a C-only file */\n"
        "/* Below is the max SM version this cuDNN library is aware of and supports natively */\n\n"
        "#define CUDNN_MAX_SM_MAJOR_NUMBER 9\n#define CUDNN_MAX_SM_MINOR_NUMBER 0\n"
        "#define CUDNN_MAX_DEVICE_VERSION (CUDNN_MAX_SM_MAJOR_NUMBER * 100) + "
        "(CUDNN_MAX_SM_MINOR_NUMBER * 10)\n\n#endif /* CUDNN_VERSION_H */\n"
    )


def build_cudnn(work: Path) -> bytes:
    t = Tree()
    major, minor, patch = (int(x) for x in CUDNN_VERSION.split(".")[:3])
    full = f"{major}.{minor}.{patch}"
    hdrs = ["cudnn_backend"] + [f"cudnn_{s}" for s in CUDNN_SUBLIBS]
    body = "".join(f'#include "{h}.h"\n' for h in hdrs if h != "cudnn_backend")
    t.file(
        "include/cudnn.h",
        "/* p40lab placeholder of cudnn.h */\n\n#if !defined(CUDNN_H_)\n#define CUDNN_H_\n\n"
        '#include <cuda_runtime.h>\n#include <stdint.h>\n\n#include "cudnn_version.h"\n'
        + body
        + "\n#endif /* CUDNN_H_ */\n",
    )
    t.file("include/cudnn_version.h", cudnn_version_h(major, minor, patch))
    for h in hdrs:
        guard = h.upper() + "_H_"
        t.file(
            f"include/{h}.h",
            f"/* p40lab placeholder of {h}.h (cuDNN {full}) */\n#if !defined({guard})\n"
            f'#define {guard}\n#include "cudnn_version.h"\n#endif\n',
        )
    for h in ["cudnn", "cudnn_version"] + hdrs:
        t.file(
            f"include/{h}_v{major}.h",
            f'/* p40lab placeholder: versioned alias */\n#include "{h}.h"\n',
        )
    for name in ["libcudnn"] + [f"libcudnn_{s}" for s in CUDNN_SUBLIBS]:
        real, soname = f"{name}.so.{full}", f"{name}.so.{major}"
        t.file(f"lib/{real}", shared_lib(soname, work), 0o755)
        t.link(f"lib/{soname}", real)
        t.link(f"lib/{name}.so", soname)
    t.file(
        "LICENSE",
        "p40lab placeholder: the real archive carries the NVIDIA cuDNN Software License "
        "Agreement here.\n",
    )
    return t.tar_bytes(top=CUDNN_TOP, compress="xz")


def build_miniconda(
    version: str = MINICONDA_VERSION, conda_version: str = CONDA_VERSION, tos_plugin: bool = False
) -> bytes:
    """The installer double; ``tos_plugin``: its conda has ``conda tos`` (Miniconda >= 25.5.1)."""
    t = Tree()
    conda = fill(
        doubles.source("conda.py"),
        CONDA_VERSION=conda_version,
        TOS_PLUGIN="yes" if tos_plugin else "no",
    )
    t.file("conda.py", conda, 0o755)
    t.file("conda.sh", doubles.source("conda.sh"))
    payload = t.tar_bytes()
    header = fill(
        doubles.source("miniconda-installer.sh"),
        MC_VERSION=version,
        CONDA_VERSION=conda_version,
    )
    header = header.replace("@SKIP@", str(header.count("\n") + 1))
    return header.encode() + payload


# ---------------------------------------------------------------------------- apt repo


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


# ---------------------------------------------------------------------------- build + pins


def _artifact(adir: Path, base_url: str, name: str, version: str) -> dict[str, Any]:
    p = adir / name
    return {
        "version": version,
        "filename": name,
        "url": f"{base_url.rstrip('/')}/artifacts/{name}",
        "sha256": sha256_file(p),
        "size": p.stat().st_size,
    }


def _stamp(kernel_release: str, base_url: str, unpack_bytes: int) -> str:
    h = hashlib.sha256()
    h.update(f"{BUILD_VERSION}\n{kernel_release}\n{base_url}\n{unpack_bytes}\n".encode())
    h.update(doubles.sources_hash().encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()


def build(
    mirror_dir: Path = MIRROR_DIR,
    *,
    kernel_release: str | None = None,
    base_url: str = BASE_URL,
    unpack_bytes: int | None = None,
) -> dict[str, Any]:
    """Build artifacts/ and apt/ into ``mirror_dir`` (replacing only those) and return the pins."""
    mirror_dir = Path(mirror_dir)
    kr = kernel_release or os.uname().release
    if unpack_bytes is None:
        unpack_bytes = int(os.environ.get("P40LAB_CUDA_UNPACK_BYTES", CUDA_UNPACK_BYTES_REAL))
    mirror_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=".build-", dir=mirror_dir) as tmp:
        tmpd = Path(tmp)
        work = tmpd / "work"
        work.mkdir()
        adir = tmpd / "artifacts"
        adir.mkdir()
        products = {
            driver_filename(DRIVER_VERSION): build_driver(DRIVER_VERSION, kr, work),
            CUDA_FILENAME: build_cuda(kr, work, unpack_bytes),
            CUDNN_FILENAME: build_cudnn(work),
            MINICONDA_FILENAME: build_miniconda(),
            MINICONDA_TOS_FILENAME: build_miniconda(
                MINICONDA_TOS_VERSION, CONDA_TOS_VERSION, tos_plugin=True
            ),
        }
        for v in EXTRA_DRIVER_VERSIONS:
            products[driver_filename(v)] = build_driver(v, kr, work)
        for name, data in products.items():
            (adir / name).write_bytes(data)
            (adir / name).chmod(0o755 if name.endswith((".run", ".sh")) else 0o644)
        sums = "".join(
            f"{hashlib.sha256(products[n]).hexdigest()}  {n}\n" for n in sorted(products)
        )
        (adir / "SHA256SUMS").write_text(sums)
        build_apt(tmpd / "apt", kr, work)
        for sub in ("artifacts", "apt"):
            old = mirror_dir / sub
            if old.exists():
                trash = tmpd / f"old-{sub}"
                old.rename(trash)
            (tmpd / sub).rename(old)
    shutil.rmtree(mirror_dir / ORIG_DIR, ignore_errors=True)
    pins = make_pins(mirror_dir, base_url)
    stamp = {
        "stamp": _stamp(kr, base_url, unpack_bytes),
        "built_at": time.time(),
        "seconds": round(time.monotonic() - t0, 2),
        "kernel_release": kr,
        "pins": pins,
    }
    (mirror_dir / STAMP_FILE).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
    log(f"mirror doubles built in {stamp['seconds']} s: {mirror_dir}")
    return pins


def make_pins(mirror_dir: Path, base_url: str = BASE_URL) -> dict[str, Any]:
    """Pins shaped like StackSpec (driver/cuda/cudnn/miniconda = Artifact, mirror = Mirror
    subset) plus ``extra_artifacts`` (alternate driver versions, the Miniconda with the ToS
    plugin; not a StackSpec key)."""
    adir = Path(mirror_dir) / "artifacts"
    return {
        "driver": _artifact(adir, base_url, driver_filename(DRIVER_VERSION), DRIVER_VERSION),
        "cuda": _artifact(adir, base_url, CUDA_FILENAME, CUDA_VERSION),
        "cudnn": _artifact(adir, base_url, CUDNN_FILENAME, CUDNN_VERSION),
        "miniconda": _artifact(adir, base_url, MINICONDA_FILENAME, MINICONDA_VERSION),
        "mirror": {"artifacts_url": f"{base_url.rstrip('/')}/artifacts"},
        "extra_artifacts": {
            f"driver-{v}": _artifact(adir, base_url, driver_filename(v), v)
            for v in EXTRA_DRIVER_VERSIONS
        }
        | {
            f"miniconda-{MINICONDA_TOS_VERSION}": _artifact(
                adir, base_url, MINICONDA_TOS_FILENAME, MINICONDA_TOS_VERSION
            )
        },
    }


STACK_KEYS = ("driver", "cuda", "cudnn", "miniconda", "mirror")


def stack_overrides(pins: dict[str, Any]) -> dict[str, Any]:
    """The StackSpec-shaped subset of the pins (what goes into host data ``stack``)."""
    return {k: pins[k] for k in STACK_KEYS if k in pins}


def _state_get(state: Any, key: str, default: Any = None) -> Any:
    if isinstance(state, dict):
        return state.get(key, default)
    return getattr(state, key, default)


def ensure_mirror(
    state: Any = None,
    mirror_dir: Path | None = None,
    *,
    force: bool = False,
    kernel_release: str | None = None,
) -> dict[str, Any]:
    """Build the doubles into the mirror unless the cached build is current (stamp = hash of the
    double sources, this module, kernel release, base URL, unpack requirement) and intact.
    Returns the pins; also calls ``p40lab.state.set_stack_overrides`` when it exists."""
    mirror_dir = Path(mirror_dir or _state_get(state, "mirror_dir") or MIRROR_DIR)
    base_url = _state_get(state, "mirror_url") or BASE_URL
    kr = kernel_release or os.uname().release
    unpack = int(os.environ.get("P40LAB_CUDA_UNPACK_BYTES", CUDA_UNPACK_BYTES_REAL))
    pins = None
    if not force:
        try:
            cached = json.loads((mirror_dir / STAMP_FILE).read_text())
        except (OSError, ValueError):
            cached = {}
        if cached.get("stamp") == _stamp(kr, base_url, unpack):
            for name in list((mirror_dir / ORIG_DIR).glob("*")):
                restore_artifact(name.name, mirror_dir)  # a fault test left one corrupted
            try:
                current = make_pins(mirror_dir, base_url)
            except OSError:
                current = None
            if current == cached.get("pins"):
                pins = current
                log(f"mirror doubles up to date: {mirror_dir}")
    if pins is None:
        pins = build(mirror_dir, kernel_release=kr, base_url=base_url, unpack_bytes=unpack)
    try:
        from p40lab import state as lab_state
    except ImportError:  # pragma: no cover
        lab_state = None
    if lab_state is not None and hasattr(lab_state, "set_stack_overrides"):
        from p40lab import sim_stack, training_data

        python = sim_stack.build_python_mirror(mirror_dir, base_url)
        # the training model and data archives, beside the doubles (same bytes every build)
        training = training_data.build_training_archives(mirror_dir / "artifacts", base_url)
        stack = sim_stack.sim_stack(
            pins, python, base_url, sim_stack.base_python_version(), unpack_bytes=unpack,
            training=training,
        )  # fmt: skip
        lab_state.set_stack_overrides(stack, replace=True)
    return pins


# ---------------------------------------------------------------------------- fault helpers


def corrupt_artifact(name: str, mirror_dir: Path = MIRROR_DIR) -> Path:
    """Flip bytes in the middle of the served copy of artifacts/NAME (pristine copy kept)."""
    mirror_dir = Path(mirror_dir)
    p = mirror_dir / "artifacts" / name
    orig = mirror_dir / ORIG_DIR / name
    orig.parent.mkdir(parents=True, exist_ok=True)
    if not orig.exists():
        shutil.copy2(p, orig)
    data = bytearray(p.read_bytes())
    mid = len(data) // 2
    for i in range(mid, min(mid + 16, len(data))):
        data[i] ^= 0xFF
    p.write_bytes(bytes(data))
    return p


def restore_artifact(name: str, mirror_dir: Path = MIRROR_DIR) -> Path:
    mirror_dir = Path(mirror_dir)
    p = mirror_dir / "artifacts" / name
    orig = mirror_dir / ORIG_DIR / name
    if orig.exists():
        shutil.copy2(orig, p)
        orig.unlink()
    return p


# ---------------------------------------------------------------------------- HTTP server


_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


class _Handler(SimpleHTTPRequestHandler):
    """The standard library's file server plus single byte ranges (RFC 9110 §14), so that
    ``curl -C -`` resumes as against a real web server: ``206`` + ``Content-Range`` for a
    satisfiable range, ``416`` + ``Content-Range: bytes */SIZE`` past the end, ``200`` (the
    whole file) for a header it does not understand (several ranges, garbage), as the RFC
    allows. ``rate`` (bytes/s, 0 = as fast as possible) slows the body down for fault tests."""

    access_log: Path = ACCESS_LOG
    protocol_version = "HTTP/1.0"
    rate: int = 0

    def send_response(self, code, message=None):
        self._p40_status = code
        super().send_response(code, message)

    def end_headers(self):
        if self._p40_status in (200, 206):
            self.send_header("Accept-Ranges", "bytes")
        super().end_headers()

    def _byte_range(self, size: int) -> tuple[int, int] | None | bool:
        """``(first, last)`` asked for, ``None`` for no usable Range, ``False`` if unsatisfiable."""
        match = _RANGE.fullmatch(self.headers.get("Range", "").strip())
        if not match or match.group(1) == match.group(2) == "":
            return None
        first, last = match.group(1), match.group(2)
        if first == "":  # suffix: the last N bytes
            n = int(last)
            return (max(size - n, 0), size - 1) if n > 0 and size > 0 else False
        lo = int(first)
        hi = min(int(last), size - 1) if last else size - 1
        if last and int(last) < lo:
            return None  # invalid: ignored, the whole file is sent
        return (lo, hi) if lo < size else False

    def send_head(self):
        self._p40_left = None
        if "Range" not in self.headers:
            return super().send_head()
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            return super().send_head()
        f = open(path, "rb")  # noqa: SIM115 - handed to copyfile, closed by the base class
        size = os.fstat(f.fileno()).st_size
        wanted = self._byte_range(size)
        if wanted is None:
            f.close()
            return super().send_head()
        if wanted is False:
            f.close()
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        lo, hi = wanted
        f.seek(lo)
        self._p40_left = hi - lo + 1
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {lo}-{hi}/{size}")
        self.send_header("Content-Length", str(hi - lo + 1))
        self.send_header("Last-Modified", self.date_time_string(int(os.path.getmtime(path))))
        self.end_headers()
        return f

    def copyfile(self, source, outputfile):
        left = getattr(self, "_p40_left", None)
        chunk = max(1024, self.rate // 10) if self.rate else 64 * 1024
        while left is None or left > 0:
            buf = source.read(chunk if left is None else min(chunk, left))
            if not buf:
                break
            outputfile.write(buf)
            # counted as it goes: a client cut off mid-body was still sent these bytes
            self._p40_sent = getattr(self, "_p40_sent", 0) + len(buf)
            if left is not None:
                left -= len(buf)
            if self.rate:
                outputfile.flush()
                time.sleep(len(buf) / self.rate)

    def handle_one_request(self):
        self._p40_sent = 0
        self._p40_status = 0
        try:
            super().handle_one_request()
        finally:
            if getattr(self, "command", None):
                line = (
                    f"{time.time():.3f} {self.client_address[0]} {self.command} {self.path} "
                    f"{self._p40_status} {self._p40_sent}\n"
                )
                with open(self.access_log, "a") as f:
                    f.write(line)

    def log_message(self, format, *args):  # noqa: A002 - stdlib signature
        pass


def serve(
    mirror_dir: Path,
    bind: str = BIND,
    port: int = PORT,
    access_log: Path = ACCESS_LOG,
    rate: int = 0,
):
    access_log.parent.mkdir(parents=True, exist_ok=True)
    handler = type("Handler", (_Handler,), {"access_log": access_log, "rate": rate})

    def make(*a, **kw):
        return handler(*a, directory=str(mirror_dir), **kw)

    ThreadingHTTPServer.allow_reuse_address = True
    httpd = ThreadingHTTPServer((bind, port), make)
    signal.signal(signal.SIGTERM, lambda *_: (httpd.server_close(), sys.exit(0)))
    httpd.serve_forever()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def start_server(
    mirror_dir: Path | None = None,
    bind: str = BIND,
    port: int = PORT,
    *,
    access_log: Path = ACCESS_LOG,
    pid_file: Path = PID_FILE,
    timeout: float = 10.0,
    rate: int = 0,
) -> int:
    """Start ``python -m p40lab.mirror serve`` in the background, bound ONLY to ``bind``.
    Writes ``pid_file``; returns the PID once the port accepts connections. ``rate``: bytes/s
    per response (0: unthrottled), to cut a download halfway in a fault test."""
    mirror_dir = Path(mirror_dir or MIRROR_DIR)
    stop_server(pid_file=pid_file)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    access_log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "p40lab.mirror", "serve", "--dir", str(mirror_dir)]
    cmd += ["--bind", bind, "--port", str(port), "--access-log", str(access_log)]
    cmd += ["--rate", str(rate)]
    with open(access_log.with_name("mirror-server.log"), "a") as errlog:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=errlog, stderr=errlog, env=env,
            start_new_session=True,
        )  # fmt: skip
    pid_file.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"mirror server exited (rc={proc.returncode}); see "
                f"{access_log.with_name('mirror-server.log')}"
            )
        try:
            with socket.create_connection((bind, port), timeout=0.5):
                return proc.pid
        except OSError:
            time.sleep(0.05)
    stop_server(pid_file=pid_file)
    raise RuntimeError(f"mirror server did not start listening on {bind}:{port}")


def stop_server(*, pid_file: Path = PID_FILE) -> bool:
    """Stop the server recorded in ``pid_file`` (by PID). True when one was running."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return False
    was = _pid_alive(pid)
    if was:
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            if not _pid_alive(pid):
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
    return was


def access_entries(access_log: Path = ACCESS_LOG) -> list[dict[str, Any]]:
    out = []
    try:
        lines = access_log.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(" ")
        if len(parts) != 6:
            continue
        ts, client, method, path, status, sent = parts
        out.append({"time": float(ts), "client": client, "method": method, "path": path,
                    "status": int(status), "bytes": int(sent)})  # fmt: skip
    return out


def bytes_served(
    access_log: Path = ACCESS_LOG, *, since: float = 0.0, path_prefix: str = ""
) -> int:
    """Total body bytes sent (optionally since a time / under a path prefix)."""
    return sum(
        e["bytes"]
        for e in access_entries(access_log)
        if e["time"] >= since and e["path"].startswith(path_prefix)
    )


# ---------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m p40lab.mirror")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--dir", type=Path, default=MIRROR_DIR)
    b.add_argument("--force", action="store_true")
    s = sub.add_parser("serve")
    s.add_argument("--dir", type=Path, default=MIRROR_DIR)
    s.add_argument("--bind", default=BIND)
    s.add_argument("--port", type=int, default=PORT)
    s.add_argument("--access-log", type=Path, default=ACCESS_LOG)
    s.add_argument("--rate", type=int, default=0, help="bytes/s per response (0: unthrottled)")
    st = sub.add_parser("start")
    st.add_argument("--dir", type=Path, default=MIRROR_DIR)
    st.add_argument("--bind", default=BIND)
    st.add_argument("--port", type=int, default=PORT)
    sub.add_parser("stop")
    sub.add_parser("bytes")
    for name in ("corrupt", "restore"):
        c = sub.add_parser(name)
        c.add_argument("name")
        c.add_argument("--dir", type=Path, default=MIRROR_DIR)
    a = ap.parse_args(argv)
    if a.cmd == "build":
        print(json.dumps(ensure_mirror(None, a.dir, force=a.force), indent=2))
    elif a.cmd == "serve":
        serve(a.dir, a.bind, a.port, a.access_log, a.rate)
    elif a.cmd == "start":
        print(start_server(a.dir, a.bind, a.port))
    elif a.cmd == "stop":
        print("stopped" if stop_server() else "not running")
    elif a.cmd == "bytes":
        print(bytes_served())
    elif a.cmd == "corrupt":
        print(corrupt_artifact(a.name, a.dir))
    elif a.cmd == "restore":
        print(restore_artifact(a.name, a.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
