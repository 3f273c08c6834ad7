"""Tiny real ELF objects made with gcc, so that kmod, ldconfig and ldd accept the doubles."""

from __future__ import annotations

import subprocess
from pathlib import Path


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
