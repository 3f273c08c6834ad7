"""What happens at every (re)boot of a lab host, before its sshd starts.

The supervisor (:mod:`p40lab.supervisor`) runs :func:`apply_hook` on the controller side against
the host's merged rootfs (``/sys`` of a host is a plain directory in its overlay), then starts the
host's PID 1 with :data:`INIT_SCRIPT`. Paths, as seen inside the host (the doubles rely on them):

* **nouveau** — ``/sys/module/nouveau`` exists ("loaded") unless some file in
  ``/etc/modprobe.d/`` has a ``blacklist nouveau`` line AND the initramfs was regenerated after
  that file: mtime of ``/var/lib/p40lab-sim/initramfs-updated`` (touched by the
  ``update-initramfs`` double) >= mtime of the blacklist file. A blacklist alone is not enough.
* **kernel** — the release the host runs (:func:`booted_release`): the one ``/boot/p40lab-default-
  kernel`` names when its ``/boot/vmlinuz-R`` is there (the mirror's ``linux-image-R`` writes it,
  as update-grub makes the newest kernel the default), else the controller's. Written to
  ``/run/p40lab-sim/kernel-release``, which the uname shim (``p40lab/doubles/uname-shim.c``)
  answers from: ``uname -r``, modinfo and dkms inside say that release.
* **nvidia** — loaded iff that kernel has an ``nvidia.ko`` (``/lib/modules/R/updates/dkms/``,
  from dkms, or ``kernel/drivers/video/`` from a runfile install without DKMS) and
  nouveau is not loaded. Then ``/sys/module/nvidia/version`` = content of
  ``/var/lib/p40lab-sim/nvidia-module-version`` (``unknown`` if absent) and
  ``/run/p40lab-sim/nvidia-loaded`` holds the same version (the ``/proc/driver/nvidia/version``
  stand-in; ``/run`` is a fresh tmpfs each boot). Otherwise ``/sys/module/nvidia`` is removed.
* GPUs (NVIDIA, class 0x03xxxx) get ``driver`` symlinks to the loaded module
  (``/sys/bus/pci/drivers/{nouveau,nvidia}/<bdf>``), none when neither is loaded.
* ``/proc/modules`` is a bind-mounted fake listing the loaded modules (so ``lsmod`` agrees),
  when the controller's kernel has a /proc/modules at all (a kernel without modules has none).
* ``/tmp`` is emptied, as Ubuntu's systemd-tmpfiles does at every boot.
* ``/run/p40lab-sim/boot`` holds the boot number (1 = first boot after ``up``/``reinstall``).
* Then every executable ``/etc/p40lab-sim/boot.d/*`` runs (sorted, chrooted, env
  ``P40LAB_HOST``, ``P40LAB_BOOT``), output to the host console log
  (``/var/lib/p40lab/run/<host>/console.log`` on the controller); a failure is logged and the
  boot goes on. This is the extension point for the doubles (e.g. /dev/nvidia* nodes).
* ``/var/lib/p40lab-sim/poweroff`` (written by the ``shutdown``/``poweroff`` shims) makes the
  supervisor leave the host powered off instead of booting it again.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from p40lab import fakehw

SIM_DIR = "var/lib/p40lab-sim"
INITRAMFS_STAMP = f"{SIM_DIR}/initramfs-updated"
NVIDIA_VERSION_FILE = f"{SIM_DIR}/nvidia-module-version"
POWEROFF_FLAG = f"{SIM_DIR}/poweroff"
RUN_SIM_DIR = "run/p40lab-sim"
NVIDIA_LOADED = f"{RUN_SIM_DIR}/nvidia-loaded"
BOOT_D = "etc/p40lab-sim/boot.d"
BOOT_DEFAULT = "boot/p40lab-default-kernel"
KERNEL_RELEASE_FILE = f"{RUN_SIM_DIR}/kernel-release"
_RELEASE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")

_BLACKLIST = re.compile(r"^\s*blacklist\s+nouveau\s*(#.*)?$", re.MULTILINE)


def kernel_release() -> str:
    return os.uname().release


def booted_release(root: Path) -> str:
    """The kernel release the host boots: ``/boot/p40lab-default-kernel`` if that kernel's image
    is installed, else the controller's (a host without a kernel update)."""
    try:
        release = (root / BOOT_DEFAULT).read_text().strip()
    except OSError:
        release = ""
    if _RELEASE.fullmatch(release) and (root / f"boot/vmlinuz-{release}").is_file():
        return release
    return kernel_release()


def nvidia_ko(root: Path, release: str | None = None) -> Path | None:
    """The kernel's nvidia.ko: DKMS's (updates/dkms) or a runfile install's without DKMS."""
    moddir = root / "lib/modules" / (release or kernel_release())
    for rel in ("updates/dkms/nvidia.ko", "kernel/drivers/video/nvidia.ko"):
        if (moddir / rel).exists():
            return moddir / rel
    return None


def blacklist_files(root: Path) -> list[Path]:
    found = []
    for conf in sorted((root / "etc/modprobe.d").glob("*")):
        try:
            if conf.is_file() and _BLACKLIST.search(conf.read_text(errors="replace")):
                found.append(conf)
        except OSError:
            continue
    return found


def nouveau_blacklisted(root: Path) -> bool:
    """True when a blacklist exists and the initramfs was regenerated after it."""
    try:
        initramfs = (root / INITRAMFS_STAMP).stat().st_mtime_ns
    except OSError:
        return False
    return any(conf.stat().st_mtime_ns <= initramfs for conf in blacklist_files(root))


def _set_module(sysroot: Path, name: str, loaded: bool, version: str | None = None) -> None:
    mod = sysroot / "module" / name
    if not loaded:
        shutil.rmtree(mod, ignore_errors=True)
        return
    shutil.rmtree(mod, ignore_errors=True)
    mod.mkdir(parents=True)
    (mod / "initstate").write_text("live\n")
    (mod / "refcnt").write_text("0\n")
    if version is not None:
        (mod / "version").write_text(version + "\n")


def apply_hook(root: Path, modules_file: Path, release: str | None = None) -> dict:
    """Decide the kernel and the loaded modules for this boot; returns
    ``{"kernel": release, "nouveau": bool, "nvidia": ver|None}``."""
    release = release or booted_release(root)
    sysroot = root / "sys"
    nouveau = not nouveau_blacklisted(root)
    nvidia: str | None = None
    if not nouveau and nvidia_ko(root, release) is not None:
        try:
            nvidia = (root / NVIDIA_VERSION_FILE).read_text().strip() or "unknown"
        except OSError:
            nvidia = "unknown"
    _set_module(sysroot, "nouveau", nouveau)
    _set_module(sysroot, "nvidia", nvidia is not None, nvidia)
    fakehw.bind_driver(sysroot, "nouveau" if nouveau else ("nvidia" if nvidia else None))
    lines = []
    if nouveau:
        lines.append("nouveau 2306048 0 - Live 0x0000000000000000")
    if nvidia:
        lines.append("nvidia 39051264 0 - Live 0x0000000000000000 (POE)")
    modules_file.parent.mkdir(parents=True, exist_ok=True)
    modules_file.write_text("".join(line + "\n" for line in lines))
    return {"kernel": release, "nouveau": nouveau, "nvidia": nvidia}


# PID 1's script, run by `unshare ... /bin/sh -ec INIT_SCRIPT lab-init ROOT NAME MODULES NVVER
# BOOTNO KREL` inside the host's netns + fresh mount/pid/uts/ipc/time namespaces (/proc of the new
# pid namespace already mounted at ROOT/proc by unshare --mount-proc). It ends by exec'ing sshd,
# so sshd is PID 1: when it exits the supervisor boots the host again.
INIT_SCRIPT = r"""
R=$1; H=$2; MODULES=$3; NVVER=$4; BOOTNO=$5; KREL=$6
hostname "$H"
mount -t tmpfs -o mode=755,size=4m,nosuid p40lab-dev "$R/dev"
mknod -m 666 "$R/dev/null" c 1 3;  mknod -m 666 "$R/dev/zero" c 1 5
mknod -m 666 "$R/dev/full" c 1 7;  mknod -m 666 "$R/dev/random" c 1 8
mknod -m 666 "$R/dev/urandom" c 1 9; mknod -m 666 "$R/dev/tty" c 5 0
mkdir "$R/dev/pts" "$R/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 p40lab-devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"; ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"; ln -s /proc/self/fd/1 "$R/dev/stdout"
ln -s /proc/self/fd/2 "$R/dev/stderr"
mount -t tmpfs -o mode=1777,nosuid,nodev p40lab-shm "$R/dev/shm"
# hide the controller's PCI bus: lspci falls back to /proc/bus/pci when /sys/bus/pci is absent
if [ -d "$R/proc/bus/pci" ]; then mount -t tmpfs -o ro,size=4k p40lab-nopci "$R/proc/bus/pci"; fi
if [ -f "$R/proc/modules" ]; then mount --bind "$MODULES" "$R/proc/modules"; fi
mount -t tmpfs -o mode=755,size=64m,nosuid,nodev p40lab-run "$R/run"
mkdir -m 755 "$R/run/sshd" "$R/run/p40lab-sim" "$R/run/lock"
echo "$BOOTNO" > "$R/run/p40lab-sim/boot"
echo "$KREL" > "$R/run/p40lab-sim/kernel-release"
# Ubuntu empties /tmp at every boot (systemd-tmpfiles: "D /tmp 1777 root root -")
find "$R/tmp" -mindepth 1 -xdev -delete 2>/dev/null || true
if [ -n "$NVVER" ]; then echo "$NVVER" > "$R/run/p40lab-sim/nvidia-loaded"; fi
for f in "$R"/etc/p40lab-sim/boot.d/*; do
    [ -f "$f" ] && [ -x "$f" ] || continue
    echo "boot.d: ${f#"$R"}"
    P40LAB_HOST="$H" P40LAB_BOOT="$BOOTNO" chroot "$R" "${f#"$R"}" \
        || echo "boot.d: ${f#"$R"} failed (rc=$?)"
done
echo "$H: boot $BOOTNO: starting sshd"
exec chroot "$R" /usr/sbin/sshd -D -e
"""
