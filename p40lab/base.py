"""The shared read-only base rootfs: Debian bookworm minbase built with mmdebstrap.

Cached at ``/var/cache/p40lab/base-bookworm`` (``$P40LAB_CACHE``); rebuilt only when the stamp
file ``.p40lab-stamp`` (base version + suite + mirror + package list) differs or ``--force``.
Bookworm because verl needs python >= 3.10 (bookworm has 3.11; the lab wheelhouse is cp311).
Per-host identity (os-release faking, host keys, fake hardware) is written into each host's
overlay upper layer by :mod:`p40lab.hosts`, never into the base.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from p40lab.state import BASE_DIR, SUITE, LabError
from p40lab.util import log, run

BASE_VERSION = "5"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# As a stock Ubuntu 20.04 server: no dkms, gcc, g++, make or pkg-config (the lab's apt mirror
# serves them; the deploy installs them, as on a real host). python3-dev brings libc6-dev
# (zlib1g-dev needs it), not a compiler.
PACKAGES = [
    "openssh-server", "python3", "python3-venv", "sudo", "ca-certificates", "curl", "xz-utils",
    "kmod", "iproute2", "procps", "git", "python3-dev", "file", "less",
]  # fmt: skip
#: Never in the base (tests/test_doubles_unit.py holds it): what the deploy must install.
NOT_IN_BASE = ("dkms", "gcc", "g++", "make", "pkg-config", "build-essential")
STAMP = ".p40lab-stamp"
BUILD_INFO = ".p40lab-build.json"

SSHD_CONF = """\
# p40lab: key auth only; sshd runs as PID 1 of the simulated host
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
UsePAM no
MaxStartups 100:30:200
MaxSessions 50
"""

REBOOT_SHIM = """\
#!/bin/sh
# p40lab shim: sshd is PID 1; when it ends, the lab supervisor boots the host again
# (fresh /run, /dev, uptime; the disk, i.e. the overlay upper layer, survives).
sync 2>/dev/null || true
kill -TERM 1
"""

SHUTDOWN_SHIM = """\
#!/bin/sh
# p40lab shim: `shutdown -r ...` reboots; anything else powers the host off (stays down)
case " $* " in
  *" -r "*|*" --reboot "*) exec /usr/local/sbin/reboot ;;
esac
mkdir -p /var/lib/p40lab-sim && touch /var/lib/p40lab-sim/poweroff
kill -TERM 1
"""


def stamp_text() -> str:
    return (
        f"p40lab-base v{BASE_VERSION}\nsuite={SUITE}\nmirror={DEBIAN_MIRROR}\n"
        f"packages={','.join(PACKAGES)}\n"
    )


def is_current(base: Path = BASE_DIR) -> bool:
    try:
        return (base / STAMP).read_text() == stamp_text()
    except OSError:
        return False


def build_info(base: Path = BASE_DIR) -> dict:
    try:
        return json.loads((base / BUILD_INFO).read_text())
    except (OSError, ValueError):
        return {}


def in_use(base: Path = BASE_DIR) -> bool:
    """True when an overlay mount uses the base as its lowerdir (a lab is up)."""
    needle = f"lowerdir={base}"
    with open("/proc/self/mountinfo") as f:
        return any(needle in line for line in f)


def ensure_mmdebstrap() -> None:
    if shutil.which("mmdebstrap"):
        return
    log("mmdebstrap missing: apt-get install mmdebstrap")
    proc = run(["apt-get", "install", "-y", "--no-install-recommends", "mmdebstrap"], check=False)
    if proc.returncode != 0 or not shutil.which("mmdebstrap"):
        tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-5:])
        raise LabError(
            "could not install mmdebstrap with apt-get (is the Debian archive reachable? "
            f"try `apt-get update`):\n{tail}"
        )


def _customize(root: Path) -> None:
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()  # per-host keys are installed by `up` (stable across down/up)
    (root / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ssh/sshd_config.d/p40lab.conf").write_text(SSHD_CONF)
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ssh_dir.chmod(0o700)
    sbin = root / "usr/local/sbin"
    sbin.mkdir(parents=True, exist_ok=True)
    for name, text in (("reboot", REBOOT_SHIM), ("shutdown", SHUTDOWN_SHIM)):
        (sbin / name).write_text(text)
        (sbin / name).chmod(0o755)
    for name in ("poweroff", "halt"):
        (sbin / name).write_text("#!/bin/sh\nexec /usr/local/sbin/shutdown -h now\n")
        (sbin / name).chmod(0o755)
    for d in ("etc/p40lab-sim/boot.d", "var/lib/p40lab-sim", "run/sshd"):
        (root / d).mkdir(parents=True, exist_ok=True)


def build(force: bool = False, base: Path = BASE_DIR) -> float | None:
    """Build the base if missing/outdated; returns the build time in s (None when cached)."""
    if is_current(base) and not force:
        info = build_info(base)
        log(f"base up to date: {base} (built in {info.get('seconds', '?')} s)")
        return None
    if in_use(base):
        raise LabError(f"base {base} is in use by a running lab: run `python -m p40lab down`")
    ensure_mmdebstrap()
    tmp = base.with_name(base.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    log(f"building base {SUITE} with mmdebstrap ({len(PACKAGES)} packages) -> {base}")
    t0 = time.monotonic()
    cmd = [
        "mmdebstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
        "--aptopt=Acquire::Retries \"3\"",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--dpkgopt=path-exclude=/usr/share/info/*",
        SUITE, str(tmp), DEBIAN_MIRROR,
    ]  # fmt: skip
    proc = run(cmd, check=False)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = "\n".join((proc.stderr or "").strip().splitlines()[-8:])
        raise LabError(
            f"mmdebstrap failed (rc={proc.returncode}); is {DEBIAN_MIRROR} reachable?\n{tail}"
        )
    _customize(tmp)
    seconds = round(time.monotonic() - t0, 1)
    (tmp / BUILD_INFO).write_text(
        json.dumps({"seconds": seconds, "built_at": time.time(), "packages": PACKAGES}) + "\n"
    )
    (tmp / STAMP).write_text(stamp_text())
    shutil.rmtree(base, ignore_errors=True)
    tmp.rename(base)
    log(f"base built in {seconds} s: {base}")
    return seconds


def require_base(base: Path = BASE_DIR) -> None:
    if not is_current(base):
        raise LabError(f"no up-to-date base at {base}: run `python -m p40lab base`")
