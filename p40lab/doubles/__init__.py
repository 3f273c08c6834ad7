"""Installer doubles for the simulated lab (see docs in each source file).

Sources in this package (templates: ``@NAME@`` placeholders are filled by :mod:`p40lab.mirror`):

* ``update-initramfs``, ``systemctl`` — system tools of a real Ubuntu 20.04, installed into each
  host's disk by :func:`install_system_doubles` (``systemctl`` with the boot hook
  :data:`SYSTEMD_BOOT_HOOK` that plays systemd at every boot: see the double's docstring);
* ``dkms`` — NOT on a stock Ubuntu 20.04 server, so not on a lab host: the mirror's apt repo
  serves it as the package ``dkms`` (:mod:`p40lab.apt`) and the deploy installs it;
* ``uname-shim.c`` — the release the host's kernel reports (``/etc/ld.so.preload``; see the
  source), so a host can boot a second kernel release (:mod:`p40lab.boot`);
* ``makeself-header.sh`` — the self-extracting header of every ``.run`` double;
* ``nvidia-installer.sh``, ``nvidia-smi.py`` — the driver runfile payload;
* ``cuda-installer.sh``, ``nvcc.sh`` — the CUDA runfile payload;
* ``miniconda-installer.sh``, ``conda.py``, ``conda.sh`` — the Miniconda installer;
* ``kmod.c.in``/``lib.c`` equivalents are generated inline by the mirror builder.
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

DOUBLES_DIR = Path(__file__).resolve().parent
SYSTEM_DOUBLES = {
    "update-initramfs": "usr/sbin/update-initramfs",
    "systemctl": "usr/bin/systemctl",
}
SYSTEMD_BOOT_HOOK = "etc/p40lab-sim/boot.d/50-systemd"
SYSTEMD_BOOT_SCRIPT = """\
#!/bin/sh
# p40lab: systemd's part at boot (/run/systemd/system, enabled units started): the systemctl double
exec /usr/bin/systemctl --p40lab-boot
"""
DEFAULT_MIRROR_BASE = "http://10.231.0.1:8111"
UNAME_SHIM = "usr/local/lib/p40lab/libp40lab-uname.so"


@functools.cache
def uname_shim() -> bytes:
    """``uname-shim.c`` built with the controller's gcc (once per process)."""
    with tempfile.TemporaryDirectory(prefix="p40lab-uname-") as tmp:
        out = Path(tmp) / "shim.so"
        cmd = ["gcc", "-shared", "-fPIC", "-O2", "-o", str(out), str(DOUBLES_DIR / "uname-shim.c")]
        proc = subprocess.run([*cmd, "-ldl"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"gcc could not build the lab's uname shim: {proc.stderr.strip()}")
        return out.read_bytes()


def source(name: str) -> str:
    return (DOUBLES_DIR / name).read_text()


def sources_hash() -> str:
    """sha256 over every double source (the mirror's cache stamp)."""
    h = hashlib.sha256()
    for p in sorted(DOUBLES_DIR.iterdir()):
        if p.is_file() and p.suffix != ".pyc":
            h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def sources_list(mirror_base: str = DEFAULT_MIRROR_BASE) -> str:
    """The image's own apt source: the distribution's archive, unreachable from a lab host (no
    route out), as on a real air-gapped host. The mirror's apt repo (``<mirror_base>/apt``)
    reaches hosts only through the deploy (``stack.mirror.apt``, deploy/system.py).
    ``mirror_base`` is kept for callers; the image no longer names the mirror."""
    del mirror_base
    return (
        "# the distribution's archive, as installed; a lab host has no route to it\n"
        "deb http://deb.debian.org/debian bookworm main\n"
    )


def install_system_doubles(
    rootfs: Path, kernel_release: str, mirror_base: str = DEFAULT_MIRROR_BASE
) -> list[Path]:
    """Install the system-tool doubles of a real Ubuntu 20.04 into ``rootfs``.

    ``update-initramfs`` (``-u`` touches /var/lib/p40lab-sim/initramfs-updated), the uname
    shim (``/etc/ld.so.preload``), ``systemctl`` + its boot hook (service units,
    enabled ones started at boot), ``/lib/modules/<kernel_release>/`` (empty, as on a
    machine whose kernel is installed) and ``/etc/apt/sources.list`` naming only the
    distribution's archive, which a lab host cannot reach (the deploy adds the mirror).
    Returns the paths written.
    """
    rootfs = Path(rootfs)
    written = []
    for name, rel in SYSTEM_DOUBLES.items():
        dst = rootfs / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(DOUBLES_DIR / name, dst)
        dst.chmod(0o755)
        written.append(dst)
    for d in ("var/lib/p40lab-sim", "etc/modprobe.d", "boot"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    shim = rootfs / UNAME_SHIM
    shim.parent.mkdir(parents=True, exist_ok=True)
    shim.write_bytes(uname_shim())
    shim.chmod(0o644)
    (rootfs / "etc/ld.so.preload").write_text(f"/{UNAME_SHIM}\n")
    written += [shim, rootfs / "etc/ld.so.preload"]
    hook = rootfs / SYSTEMD_BOOT_HOOK
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text(SYSTEMD_BOOT_SCRIPT)
    hook.chmod(0o755)
    written.append(hook)
    (rootfs / "etc/systemd/system").mkdir(parents=True, exist_ok=True)
    # merged-/usr bases: /lib -> usr/lib; create through the symlink like the kernel package would
    moddir = rootfs / "lib/modules" / kernel_release
    moddir.mkdir(parents=True, exist_ok=True)
    for f in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
        (moddir / f).touch()
    written.append(moddir)
    apt = rootfs / "etc/apt"
    (apt / "sources.list.d").mkdir(parents=True, exist_ok=True)
    for old in (apt / "sources.list.d").iterdir():
        if old.name.endswith((".list", ".sources")):
            old.unlink()
    (apt / "sources.list").write_text(sources_list(mirror_base))
    written.append(apt / "sources.list")
    return written
