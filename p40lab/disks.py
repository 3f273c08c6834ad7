"""Lab host disks: the overlay mounts, and provisioning a host's identity into its disk.

The disk is an overlay of the shared base (lower, read-only) and
``/var/lib/p40lab/hosts/labN/upper``, merged at ``/var/lib/p40lab/hosts/labN/root``.
:func:`provision` writes the identity (hostname, /etc/hosts, ssh host key, the controller's key,
the admin accounts, os-release), the system doubles, the fake PCI tree and the kernel headers.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import time
from pathlib import Path

from p40lab import doubles, fakehw, net
from p40lab import state as st
from p40lab.boot import kernel_release
from p40lab.plan import HostSpec, host_dirs
from p40lab.state import LabError
from p40lab.util import log, run

FOCAL_OS_RELEASE = """\
NAME="Ubuntu"
VERSION="20.04.6 LTS (Focal Fossa)"
ID=ubuntu
ID_LIKE=debian
PRETTY_NAME="Ubuntu 20.04.6 LTS"
VERSION_ID="20.04"
HOME_URL="https://www.ubuntu.com/"
SUPPORT_URL="https://help.ubuntu.com/"
BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"
PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"
VERSION_CODENAME=focal
UBUNTU_CODENAME=focal
"""
FOCAL_LSB_RELEASE = """\
DISTRIB_ID=Ubuntu
DISTRIB_RELEASE=20.04
DISTRIB_CODENAME=focal
DISTRIB_DESCRIPTION="Ubuntu 20.04.6 LTS"
"""


# --------------------------------------------------------------------------- keys


def ensure_controller_key() -> None:
    st.LAB_DIR.mkdir(parents=True, exist_ok=True)
    if not st.SSH_KEY.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "p40lab-controller",
             "-f", str(st.SSH_KEY)])  # fmt: skip


def host_key(name: str) -> Path:
    st.HOSTKEYS_DIR.mkdir(parents=True, exist_ok=True)
    key = st.HOSTKEYS_DIR / name
    if not key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(key)])
    return key


def write_known_hosts(specs: list[HostSpec]) -> None:
    lines = []
    for s in specs:
        kind, blob = (host_key(s.name).with_suffix(".pub").read_text().split() + ["", ""])[:2]
        lines.append(f"{s.ip},{s.name} {kind} {blob}\n")
    st.KNOWN_HOSTS.write_text("".join(lines))
    (st.LAB_DIR / "ssh_config").write_text(
        f"Host {st.NET}.* {st.HOST_PREFIX}*\n    User root\n    IdentityFile {st.SSH_KEY}\n"
        f"    IdentitiesOnly yes\n    UserKnownHostsFile {st.KNOWN_HOSTS}\n"
        "    StrictHostKeyChecking yes\n    BatchMode yes\n"
    )


# --------------------------------------------------------------------------- admin accounts

#: Non-root accounts on every host, as a real lab has them (the deploys reach root through
#: sudo): name -> (uid, sudo asks a password). Fixed uids: /home survives a reinstall.
ADMINS = {"admin": (1500, False), "admin-pw": (1501, True)}
SUDOERS_FILE = "etc/sudoers.d/p40lab-admins"


def sudo_password_file() -> Path:
    """The lab's sudo password of ``admin-pw`` (random, made once per instance, mode 600)."""
    return st.LAB_DIR / "admin-pw.sudo-password"


def _sudo_password() -> str:
    path = sudo_password_file()
    if not path.exists():
        st.LAB_DIR.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(18) + "\n")
    return path.read_text().strip()


def provision_admins(root: Path) -> None:
    """``admin`` (sudo without a password: the dedicated deploy account) and ``admin-pw``
    (sudo asks its password): the controller's key authorized, bash, a sudoers rule each."""
    pubkey = st.SSH_KEY.with_suffix(".pub").read_text()
    passwd = (root / "etc/passwd").read_text()
    rules = []
    for name, (uid, needs_password) in ADMINS.items():
        if f"\n{name}:" not in f"\n{passwd}":
            # useradd/chpasswd of the host itself (chrooted): its own shadow format and hashes
            run(["chroot", str(root), "useradd", "-u", str(uid), "-U", "-m", "-s", "/bin/bash",
                 name])  # fmt: skip
        # "*" = no password yet not locked: sshd (UsePAM no) refuses key logins to "!" accounts
        secret = _sudo_password() if needs_password else None
        if secret:
            run(["chroot", str(root), "chpasswd"], input=f"{name}:{secret}\n")
        else:
            run(["chroot", str(root), "usermod", "-p", "*", name])
        ssh_dir = root / "home" / name / ".ssh"
        ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        _write(ssh_dir / "authorized_keys", pubkey, 0o600)
        for path in (ssh_dir.parent, ssh_dir, ssh_dir / "authorized_keys"):
            os.chown(path, uid, uid)
        rules.append(f"{name} ALL=(ALL:ALL) {'' if needs_password else 'NOPASSWD: '}ALL\n")
    _write(root / SUDOERS_FILE, "# p40lab: the lab's admin accounts\n" + "".join(rules), 0o440)


# --------------------------------------------------------------------------- disks


def is_mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


def our_mounts() -> list[str]:
    prefix = str(st.HOSTS_DIR) + "/"
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(prefix)]


def mount_disk(name: str) -> Path:
    d = host_dirs(name)
    for key in ("upper", "work", "root", "run"):
        d[key].mkdir(parents=True, exist_ok=True)
    if not is_mounted(d["root"]):
        opts = f"lowerdir={st.BASE_DIR},upperdir={d['upper']},workdir={d['work']}"
        run(["mount", "-t", "overlay", net.netns_name(name), "-o", opts, str(d["root"])])
    return d["root"]


def umount_disk(name: str) -> None:
    root = host_dirs(name)["root"]
    for _attempt in range(20):
        if not is_mounted(root):
            return
        if run(["umount", str(root)], check=False, quiet=True).returncode == 0:
            continue
        time.sleep(0.1)
    if is_mounted(root):
        log(f"{name}: {root} busy: lazy unmount")
        run(["umount", "-l", str(root)])


def wipe_upper(name: str, keep: tuple[str, ...] = ()) -> None:
    d = host_dirs(name)
    if is_mounted(d["root"]):
        raise LabError(f"{name}: disk still mounted, cannot wipe")
    for key in ("upper", "work"):
        if not d[key].exists():
            continue
        for entry in d[key].iterdir():
            if key == "upper" and entry.name in keep:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


#: Big trees of a converged host that the deploys and provisioning never write in place (pip,
#: conda and dpkg replace files): a clone of an upper layer hard-links them.
CLONE_LINKED = (
    "home/verl/miniconda3", "usr/lib/gcc", "usr/lib/x86_64-linux-gnu", "var/cache/apt",
)  # fmt: skip
#: Files inside the linked trees that are written in place by design, copied like the rest (a
#: shared inode would carry one host's write into the seed): package archives and records at
#: the top of conda's package cache (the lab's conda double writes them over the old ones), the
#: markers at an env's top (the Apex build key: ``printf > file``) and conda's ``conda-meta``.
CLONE_COPIED = (
    "home/verl/miniconda3/pkgs/*", "home/verl/miniconda3/conda-meta/*",
    "home/verl/miniconda3/envs/*/*", "home/verl/miniconda3/envs/*/conda-meta/*",
)  # fmt: skip


def _copied_files(top: Path, copied: tuple[str, ...]) -> list[Path]:
    """The regular files of ``top`` that ``copied`` (globs, ``*`` within one path part) name."""
    found = {p for pattern in copied for p in top.glob(pattern)}
    return sorted(p for p in found if stat.S_ISREG(os.lstat(p).st_mode))


def unshare(top: Path, linked: tuple[str, ...], copied: tuple[str, ...] = CLONE_COPIED) -> int:
    """Give every regular file of ``top`` (a ``cp -al`` copy) outside ``linked``, and those of
    ``copied`` inside it, its own inode, keeping the copy's own hard links (cuDNN's, in the CUDA
    dir) between its new inodes; mode, owner, times and xattrs kept. Returns how many files
    were copied."""
    skip = {top / p for p in linked}
    mine: dict[int, Path] = {}  # the source's inode -> this copy's first file of it
    copied_n = 0

    def own(path: Path) -> None:
        nonlocal copied_n
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode):
            return
        tmp = path.with_name(f".{path.name}.p40lab-unshare")
        if info.st_ino in mine:
            os.link(mine[info.st_ino], tmp)
        else:
            shutil.copy2(path, tmp, follow_symlinks=False)
            os.chown(tmp, info.st_uid, info.st_gid)
            os.chmod(tmp, stat.S_IMODE(info.st_mode))  # after chown, which drops setuid
            copied_n += 1
        os.replace(tmp, path)
        mine.setdefault(info.st_ino, path)

    for dirpath, dirnames, filenames in os.walk(top):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d not in skip]
        for name in filenames:
            own(here / name)
    for path in _copied_files(top, copied):
        own(path)
    return copied_n


def clone_upper(
    source: Path,
    target: Path,
    linked: tuple[str, ...] = CLONE_LINKED,
    copied: tuple[str, ...] = CLONE_COPIED,
) -> int:
    """``target`` = a clone of the upper layer ``source``: hard links for ``linked`` (less
    ``copied``), a copy of every other file (copying GBs takes minutes of this machine's disk).
    Returns files copied."""
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", "--preserve=all", str(source), str(target)], check=True)
    return unshare(target, linked, copied)


def linked_signature(
    top: Path, linked: tuple[str, ...] = CLONE_LINKED, copied: tuple[str, ...] = CLONE_COPIED
) -> dict[str, tuple]:
    """``relpath -> (inode, size, mtime_ns)`` of every file in ``top``'s ``linked`` trees (less
    ``copied``): a file written in place through any of its hard links changes it."""
    own = set(_copied_files(top, copied))
    out: dict[str, tuple] = {}
    for sub in linked:
        for dirpath, _dirs, filenames in os.walk(top / sub):
            for name in filenames:
                path = Path(dirpath) / name
                if path in own:
                    continue
                info = os.lstat(path)
                out[str(path.relative_to(top))] = (info.st_ino, info.st_size, info.st_mtime_ns)
    return out


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    path.write_text(text)
    path.chmod(mode)


def install_system_doubles(root: Path) -> None:
    """``p40lab.doubles.install_system_doubles`` into a host's disk (update-initramfs,
    systemctl, the uname shim, /lib/modules/<release>, apt sources = the distribution's
    archive, which a host cannot reach: the deploy adds the mirror's; no dkms).

    Per host (upper layer), not in the base: the base stays independent of the doubles, and a
    reinstall brings them back like a real Ubuntu install brings its tools."""
    doubles.install_system_doubles(root, kernel_release(), st.MIRROR_URL)


def provision(spec: HostSpec, specs: list[HostSpec]) -> None:
    """Write the host's identity and fake hardware into its (mounted) disk."""
    root = host_dirs(spec.name)["root"]
    _write(root / "etc/hostname", spec.name + "\n")
    hosts = ["127.0.0.1\tlocalhost\n", f"{st.CONTROLLER_IP}\tp40lab-controller p40lab-mirror\n"]
    hosts += [f"{s.ip}\t{s.name}\n" for s in specs]
    _write(root / "etc/hosts", "".join(hosts))
    key = host_key(spec.name)
    shutil.copyfile(key, root / "etc/ssh/ssh_host_ed25519_key")
    (root / "etc/ssh/ssh_host_ed25519_key").chmod(0o600)
    _write(root / "etc/ssh/ssh_host_ed25519_key.pub", key.with_suffix(".pub").read_text())
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    _write(ssh_dir / "authorized_keys", st.SSH_KEY.with_suffix(".pub").read_text(), 0o600)
    provision_admins(root)
    if spec.os == "ubuntu20.04":
        _write(root / "etc/os-release", FOCAL_OS_RELEASE)
        _write(root / "usr/lib/os-release", FOCAL_OS_RELEASE)
        _write(root / "etc/lsb-release", FOCAL_LSB_RELEASE)
        _write(root / "etc/debian_version", "bullseye/sid\n")
        _write(root / "etc/issue", "Ubuntu 20.04.6 LTS \\n \\l\n\n")
    install_system_doubles(root)
    fakehw.write_tree(root, spec.gpus)
    sim = root / "var/lib/p40lab-sim"
    sim.mkdir(parents=True, exist_ok=True)
    hw = {"host": spec.name, "layout": spec.layout, "gpus": fakehw.describe(spec.gpus)}
    _write(sim / "hardware.json", json.dumps(hw, indent=2) + "\n")
    release = kernel_release()
    moddir = root / "lib/modules" / release
    (moddir / "kernel").mkdir(parents=True, exist_ok=True)
    for f in ("modules.dep", "modules.alias", "modules.symbols"):
        (moddir / f).touch()
    headers = root / "usr/src" / f"linux-headers-{release}"
    build = moddir / "build"
    if spec.headers:
        (headers / "include/generated").mkdir(parents=True, exist_ok=True)
        _write(headers / "include/generated/utsrelease.h", f'#define UTS_RELEASE "{release}"\n')
        _write(headers / "Makefile", f"# p40lab stand-in kernel headers for {release}\n")
        _write(headers / ".config", "CONFIG_MODULES=y\n")
        if not build.is_symlink():
            build.symlink_to(f"/usr/src/linux-headers-{release}")
    else:
        if build.is_symlink() or build.exists():
            build.unlink() if build.is_symlink() else shutil.rmtree(build)
        shutil.rmtree(headers, ignore_errors=True)
