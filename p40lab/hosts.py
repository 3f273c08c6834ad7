"""Lab hosts: plan, provision, start, stop, reboot, reinstall.

Host ``labN`` (``10.231.0.(10+N)``):

* disk = overlay of the shared base (lower, read-only) and
  ``/var/lib/p40lab/hosts/labN/upper`` (on disk: CUDA doubles and wheels need GBs), merged at
  ``/var/lib/p40lab/hosts/labN/root`` (readable from the controller for assertions).
  ``up`` gives fresh disks (uppers wiped) unless ``--keep-disks``; ``down`` leaves the uppers on
  disk for inspection (``down --wipe`` removes them).
* identity written into the upper layer at ``up``/``reinstall``: hostname, /etc/hosts, ssh host
  key (``/var/lib/p40lab/hostkeys/labN``: stable across down/up, new at reinstall), the
  controller's key in /root/.ssh/authorized_keys and for the non-root ``admin`` (sudo,
  NOPASSWD) and ``admin-pw`` (sudo asks for ``/var/lib/p40lab/admin-pw.sudo-password``),
  os-release (Ubuntu 20.04.6 focal unless ``--os debian12``),
  the system doubles (``p40lab.doubles.install_system_doubles``: update-initramfs, dkms, apt
  sources = the mirror), the fake PCI tree (:mod:`p40lab.fakehw`),
  ``/var/lib/p40lab-sim/hardware.json``,
  ``/lib/modules/$(uname -r)/`` with a ``build`` headers dir unless ``--no-headers``.
* ``reinstall`` = OS reinstall: everything in the upper layer except ``/home`` is dropped and,
  as a real install does, the host gets a NEW ssh host key: the lab's known_hosts (the
  inventory's) then refuses it until ``python -m p40fleet.rekey``; ``keep_host_key=True``
  (``--keep-host-key``) keeps the old one, for admins who restore /etc/ssh from a backup.
  :func:`host_key_fingerprints` reads the host's key like an admin at its console.
* runtime files in ``/var/lib/p40lab/run/labN/``: console.log, supervisor.pid, unshare.pid,
  boots, boot-time, modules (fake /proc/modules), stop.

Paths and addresses above are the default instance's; ``$P40LAB_INSTANCE`` picks another (see
:mod:`p40lab.state`). Every lookup here (processes, mounts, netns, links) is by this instance's
paths and names only, so ``up``/``down``/``leftovers`` never see or touch another instance.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from p40lab import base, fakehw, net
from p40lab import state as st
from p40lab.boot import kernel_release
from p40lab.state import LabError
from p40lab.util import log, run

DEFAULT_LAYOUTS = "4xP40,8xP40,1xP100,2xH200"
OS_CHOICES = {
    "ubuntu20.04": "ubuntu20.04", "focal": "ubuntu20.04", "ubuntu": "ubuntu20.04",
    "debian12": "debian12", "bookworm": "debian12", "debian": "debian12",
}  # fmt: skip

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


@dataclass
class HostSpec:
    index: int
    layout: str
    os: str = "ubuntu20.04"
    headers: bool = True
    gpus: list[fakehw.GpuModel] = field(default_factory=list)

    @property
    def name(self) -> str:
        return st.host_name(self.index)

    @property
    def ip(self) -> str:
        return st.host_ip(self.index)

    def to_state(self) -> dict:
        d = host_dirs(self.name)
        return {
            "name": self.name, "index": self.index, "ip": self.ip, "layout": self.layout,
            "gpus": [g.pci_id for g in self.gpus], "os": self.os, "headers": self.headers,
            "netns": net.netns_name(self.name), "root": str(d["root"]), "upper": str(d["upper"]),
            "rundir": str(d["run"]), "supervisor_pid": None,
        }  # fmt: skip


def spec_from_state(h: dict) -> HostSpec:
    return HostSpec(
        h["index"], h["layout"], h["os"], h["headers"], fakehw.parse_layout(h["layout"])
    )


def host_dirs(name: str) -> dict[str, Path]:
    top = st.HOSTS_DIR / name
    return {
        "top": top, "upper": top / "upper", "work": top / "work", "root": top / "root",
        "run": st.RUN_DIR / name,
    }  # fmt: skip


# --------------------------------------------------------------------------- planning


def _host_selector(token: str, n: int) -> int:
    token = token.strip()
    idx = int(token) if token.isdigit() else None
    if idx is None and token.startswith(st.HOST_PREFIX) and token[len(st.HOST_PREFIX) :].isdigit():
        idx = int(token[len(st.HOST_PREFIX) :])
    if idx is None or not 1 <= idx <= n:
        raise LabError(f"unknown host {token!r} (hosts are {st.host_name(1)}..{st.host_name(n)})")
    return idx


def plan(
    n: int | None = None,
    gpus: str = DEFAULT_LAYOUTS,
    no_headers: str | list[str] | None = None,
    os_opts: list[str] | None = None,
) -> list[HostSpec]:
    """Turn CLI-style options into host specs.

    gpus: comma-separated per-host layouts (one layout = the same for every host);
    no_headers: host names/indices (comma-separated or list); os_opts: ``debian12`` (all hosts)
    or ``lab3=debian12``.
    """
    layouts = [x.strip() for x in gpus.split(",")] if gpus.strip() else ["0"]
    if n is None:
        n = len(layouts)
    if n < 1 or n > 200:
        raise LabError(f"--hosts {n}: between 1 and 200")
    if len(layouts) == 1:
        layouts *= n
    if len(layouts) != n:
        raise LabError(f"--gpus has {len(layouts)} layouts for {n} hosts: give 1 or {n}")
    specs = []
    for i, layout in enumerate(layouts, 1):
        try:
            specs.append(HostSpec(i, layout, gpus=fakehw.parse_layout(layout)))
        except fakehw.LayoutError as exc:
            raise LabError(f"--gpus {st.host_name(i)}: {exc}") from exc
    if isinstance(no_headers, str):
        no_headers = [x for x in no_headers.split(",") if x.strip()]
    for token in no_headers or []:
        specs[_host_selector(token, n) - 1].headers = False
    for opt in os_opts or []:
        target, _, value = opt.rpartition("=")
        os_name = OS_CHOICES.get(value.strip().lower())
        if os_name is None:
            raise LabError(f"--os {opt!r}: choose one of {', '.join(sorted(set(OS_CHOICES)))}")
        chosen = [_host_selector(t, n) for t in target.split(",")] if target else range(1, n + 1)
        for idx in chosen:
            specs[idx - 1].os = os_name
    return specs


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


def host_key_fingerprints(name: str) -> list[tuple[str, str]]:
    """``(key type, SHA256:...)`` of each ``/etc/ssh/ssh_host_*_key.pub`` on the host's disk:
    what ``ssh-keygen -lf`` shows an admin at the host's console, not read over the network."""
    out = []
    for pub in sorted((Path(get_host(name)["root"]) / "etc/ssh").glob("ssh_host_*_key.pub")):
        kind, blob = pub.read_text().split()[:2]
        digest = hashlib.sha256(base64.b64decode(blob)).digest()
        out.append((kind, "SHA256:" + base64.b64encode(digest).decode().rstrip("=")))
    return out


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


def _mounted(path: Path) -> bool:
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
    if not _mounted(d["root"]):
        opts = f"lowerdir={st.BASE_DIR},upperdir={d['upper']},workdir={d['work']}"
        run(["mount", "-t", "overlay", net.netns_name(name), "-o", opts, str(d["root"])])
    return d["root"]


def umount_disk(name: str) -> None:
    root = host_dirs(name)["root"]
    for _attempt in range(20):
        if not _mounted(root):
            return
        if run(["umount", str(root)], check=False, quiet=True).returncode == 0:
            continue
        time.sleep(0.1)
    if _mounted(root):
        log(f"{name}: {root} busy: lazy unmount")
        run(["umount", "-l", str(root)])


def wipe_upper(name: str, keep: tuple[str, ...] = ()) -> None:
    d = host_dirs(name)
    if _mounted(d["root"]):
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


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    path.write_text(text)
    path.chmod(mode)


_doubles_missing_logged = False


def install_system_doubles(root: Path) -> bool:
    """``p40lab.doubles.install_system_doubles`` into a host's disk (update-initramfs, dkms,
    /lib/modules/<release>, apt sources = the distribution's archive, which a host cannot reach:
    the deploy adds the mirror's), when the doubles package exists.

    Per host (upper layer), not in the base: the base stays independent of the doubles, and a
    reinstall brings them back like a real Ubuntu install brings its tools."""
    global _doubles_missing_logged
    try:
        doubles = importlib.import_module("p40lab.doubles")
    except ModuleNotFoundError as exc:
        if exc.name != "p40lab.doubles":
            raise
        doubles = None
    fn = getattr(doubles, "install_system_doubles", None)
    if fn is None:
        if not _doubles_missing_logged:
            log("p40lab.doubles.install_system_doubles is absent: hosts get no system doubles")
            _doubles_missing_logged = True
        return False
    fn(root, kernel_release(), st.MIRROR_URL)
    return True


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


# --------------------------------------------------------------------------- processes


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def start_supervisor(spec: HostSpec) -> int:
    d = host_dirs(spec.name)
    d["run"].mkdir(parents=True, exist_ok=True)
    for f in ("stop", "boots", "boot-time", "unshare.pid", "powered-off"):
        (d["run"] / f).unlink(missing_ok=True)
    pkg_parent = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg_parent, env.get("PYTHONPATH")]))
    with open(d["run"] / "console.log", "ab") as console:
        proc = subprocess.Popen(
            [sys.executable, "-m", "p40lab.supervisor", spec.name, net.netns_name(spec.name),
             str(d["root"]), str(d["run"])],
            stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
            start_new_session=True, cwd="/", env=env,
        )  # fmt: skip
    return proc.pid


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if st.pid_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if st.pid_alive(p)]
    return alive


def _reap(pid: int) -> None:
    """Collect a supervisor we started in this process (no zombie left behind)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop_host(h: dict) -> None:
    """Stop a host's processes: recorded PIDs first, then whatever is left in its netns."""
    d = host_dirs(h["name"])
    d["run"].mkdir(parents=True, exist_ok=True)
    (d["run"] / "stop").touch()
    sup = h.get("supervisor_pid") or _read_int(d["run"] / "supervisor.pid")
    unshare_pid = _read_int(d["run"] / "unshare.pid")
    recorded = [p for p in (sup, unshare_pid) if p]
    for pid in recorded:
        if st.pid_alive(pid):
            os.kill(pid, signal.SIGTERM if pid == sup else signal.SIGKILL)
    for pid in recorded:
        _reap(pid)
    left = _wait_gone(recorded, 3.0)
    for pid in left:
        log(f"{h['name']}: pid {pid} ignored SIGTERM: SIGKILL")
        os.kill(pid, signal.SIGKILL)
        _reap(pid)
    _wait_gone(left, 2.0)
    ns = net.netns_name(h["name"])
    strays = net.netns_pids(ns)
    for pid in strays:  # processes inside our own namespace (pid ns dies with PID 1 anyway)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if _wait_gone(strays, 3.0):
        raise LabError(f"{h['name']}: processes in netns {ns} survive SIGKILL: {strays}")
    (d["run"] / "unshare.pid").unlink(missing_ok=True)


def host_pid1(h: dict) -> int | None:
    """Controller-side PID of the host's PID 1 (the child of its unshare)."""
    unshare_pid = _read_int(host_dirs(h["name"])["run"] / "unshare.pid")
    if not unshare_pid:
        return None
    try:
        kids = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()
        return int(kids[0]) if kids else None
    except (OSError, ValueError):
        return None


def boots(h: dict) -> int:
    return _read_int(host_dirs(h["name"])["run"] / "boots") or 0


def uptime(h: dict) -> float | None:
    try:
        t = float((host_dirs(h["name"])["run"] / "boot-time").read_text())
    except (OSError, ValueError):
        return None
    return time.time() - t


def host_is_up(h: dict) -> bool:
    """Supervisor alive and the host's PID 1 is sshd (no TCP probe: keeps the logs quiet)."""
    if not st.pid_alive(h.get("supervisor_pid")):
        return False
    pid1 = host_pid1(h)
    try:
        return pid1 is not None and Path(f"/proc/{pid1}/comm").read_text().strip() == "sshd"
    except OSError:
        return False


def _wait_ready(hosts: list[dict], timeout: float = 30.0) -> None:
    missing = net.wait_ssh([h["ip"] for h in hosts], timeout)
    if missing:
        bad = [h for h in hosts if h["ip"] in missing]
        tails = []
        for h in bad:
            log_path = host_dirs(h["name"])["run"] / "console.log"
            try:
                tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
            except OSError:
                tail = "(no console log)"
            tails.append(f"--- {h['name']} ({log_path}):\n{tail}")
        raise LabError(
            f"sshd did not come up within {timeout:.0f}s on "
            f"{', '.join(h['name'] for h in bad)}\n" + "\n".join(tails)
        )


# --------------------------------------------------------------------------- mirror hook


def mirror_hook(action: str, data: dict | None = None) -> bool:
    """Call p40lab.mirror (the doubles engineer's module) if it exists.

    ``start``: ``mirror.ensure_mirror(state)`` (state = the lab state dict, see p40lab.state;
    it publishes pins with ``p40lab.state.set_stack_overrides``) then ``mirror.start_server()``
    (this instance's mirror dir, bound to its controller address only: 10.231.0.1:8111 for the
    default instance); ``stop``: ``mirror.stop_server()``. Returns False when the module is
    absent.
    """
    try:
        mirror = importlib.import_module("p40lab.mirror")
    except ModuleNotFoundError as exc:
        if exc.name != "p40lab.mirror":
            raise
        if action == "start":
            log("p40lab.mirror is absent: no artifact mirror on "
                f"{st.MIRROR_URL} (hosts up without doubles)")  # fmt: skip
        return False
    step = "ensure_mirror"
    try:
        if action == "start":
            t0 = time.monotonic()
            mirror.ensure_mirror(data)
            step = "start_server"
            mirror.start_server()
            log(f"mirror ready on {st.MIRROR_URL} ({time.monotonic() - t0:.1f} s)")
        else:
            step = "stop_server"
            mirror.stop_server()
    except Exception as exc:
        log("".join(traceback.format_exc()).rstrip())
        hint = " (`up --no-mirror` starts the lab without it)" if action == "start" else ""
        raise LabError(f"p40lab.mirror.{step} failed: {type(exc).__name__}: {exc}{hint}") from exc
    return True


# --------------------------------------------------------------------------- lab


def _locked(fn):
    """Run ``fn`` under the lab lock (one lab-changing command at a time)."""

    @functools.wraps(fn)
    def wrapper(*args, **kw):
        with st.lab_lock():
            return fn(*args, **kw)

    return wrapper


def lab_processes() -> list[int]:
    """Live (non-zombie) processes of the lab: supervisors, the mirror server, and anything
    chrooted in a host."""
    hosts_prefix = str(st.HOSTS_DIR) + "/"
    # another instance's supervisors and mirror name their own paths on the command line
    sup_mark = f" {hosts_prefix}".encode()
    mirror_mark = f" --bind {st.CONTROLLER_IP} --port {st.MIRROR_PORT} ".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            root = os.readlink(entry / "root")
        except OSError:
            continue  # gone, or a zombie (no root link)
        ours = (b"p40lab.supervisor" in cmdline and sup_mark in cmdline) or (
            b"p40lab.mirror serve" in cmdline and mirror_mark in cmdline
        )
        if root.startswith(hosts_prefix) or ours:
            if st.pid_alive(int(entry.name)):
                found.append(int(entry.name))
    return sorted(found)


def leftovers() -> dict[str, list[str]]:
    """Everything of ours still present on the controller (empty lists when clean)."""
    data = st.load()
    procs = [str(p) for p in lab_processes()]
    for h in data.get("hosts", []):
        d = host_dirs(h["name"])
        for pid in (h.get("supervisor_pid"), _read_int(d["run"] / "unshare.pid")):
            if st.pid_alive(pid):
                procs.append(str(pid))
    for ns in net.our_netns():
        procs += [str(p) for p in net.netns_pids(ns)]
    return {
        "netns": net.our_netns(),
        "mounts": our_mounts(),
        "processes": sorted(set(procs)),
        "links": [x for x in [st.BRIDGE] if net.link_exists(x)] + net.our_veths(),
        "routes": [st.SUBNET] if net.route_present() else [],
    }


def snapshot() -> dict:
    """What a running lab of this instance is made of, for "unchanged?" comparisons: the state
    file, supervisor and mirror PIDs (alive or not), netns, mounts, links and routes."""
    try:
        state_text = st.state_path().read_text()
    except FileNotFoundError:
        state_text = None
    data = st.load()
    left = leftovers()
    return {
        "state": state_text,
        "supervisors": {
            h["name"]: [h.get("supervisor_pid"), st.pid_alive(h.get("supervisor_pid"))]
            for h in data.get("hosts", [])
        },
        "mirror_pid": _read_int(st.LAB_DIR / "mirror.pid"),
        **{k: left[k] for k in ("netns", "mounts", "links", "routes")},
    }


def _running_hosts(data: dict) -> list[str]:
    return [h["name"] for h in data.get("hosts", []) if st.pid_alive(h.get("supervisor_pid"))]


@_locked
def up(
    specs: list[HostSpec], *, keep_disks: bool = False, mirror: bool = True, timeout: float = 30
) -> dict:
    base.require_base()
    data = st.load()
    if _running_hosts(data):
        raise LabError(
            f"the lab is already up ({len(data.get('hosts', []))} hosts): "
            f"run `{st.cli('down')}` first"
        )
    left = {k: v for k, v in leftovers().items() if v}
    if st.is_up(data) or left:
        # A lab whose processes were killed (a stopped CI job, a reboot of the controller) left
        # netns, mounts or links behind; no host of it runs, so clearing it loses nothing.
        log(f"clearing a stale lab first (marked up, no host running; left: {left or 'nothing'})")
        down()
        left = {k: v for k, v in leftovers().items() if v}
        if left:
            raise LabError(f"leftovers of an earlier lab survive `down`: {left}")
    t0 = time.monotonic()
    ensure_controller_key()
    write_known_hosts(specs)

    def init(d: dict) -> None:
        d.update(
            version=1, up=True, up_since=time.time(), bridge=st.BRIDGE,
            controller_ip=st.CONTROLLER_IP, subnet=st.SUBNET, base=str(st.BASE_DIR),
            instance=st.INSTANCE, mirror_dir=str(st.MIRROR_DIR),
            lab_dir=str(st.LAB_DIR), ssh_key=str(st.SSH_KEY),
            ssh_pubkey=str(st.SSH_KEY.with_suffix(".pub")), known_hosts=str(st.KNOWN_HOSTS),
            ssh_config=str(st.LAB_DIR / "ssh_config"), mirror_url=st.MIRROR_URL,
            kernel_release=kernel_release(), hosts=[s.to_state() for s in specs],
        )  # fmt: skip
        d.setdefault("stack", {})

    st.update(init)
    if not keep_disks:  # disks of hosts from an earlier, bigger lab
        wanted = {s.name for s in specs}
        for old in st.HOSTS_DIR.glob(f"{st.HOST_PREFIX}*"):
            if old.name not in wanted and old.name[len(st.HOST_PREFIX) :].isdigit():
                if not _mounted(old / "root"):
                    shutil.rmtree(old, ignore_errors=True)
    try:
        net.bridge_up()
        pids = {}
        for spec in specs:
            if not keep_disks:
                wipe_upper(spec.name)
            mount_disk(spec.name)
            provision(spec, specs)
            net.host_up(spec.name, spec.ip)
            pids[spec.name] = start_supervisor(spec)

        def record(d: dict) -> None:
            for h in d["hosts"]:
                h["supervisor_pid"] = pids.get(h["name"])

        data = st.update(record)
        if mirror:
            mirror_hook("start", data)
        _wait_ready(data["hosts"], timeout)
    except BaseException:
        log("up failed: tearing down what was started")
        try:
            down()
        except Exception as exc:  # keep the original error
            log(f"teardown after failed up also failed: {exc}")
        raise
    log(f"up: {len(specs)} hosts in {time.monotonic() - t0:.2f} s")
    return st.load()


@_locked
def down(*, wipe: bool = False, mirror: bool = True) -> dict[str, list[str]]:
    """Stop everything; returns leftovers (all lists empty on success)."""
    t0 = time.monotonic()
    data = st.load()
    hosts = data.get("hosts", [])
    if mirror:
        try:
            mirror_hook("stop")
        except Exception as exc:
            log(f"mirror stop_server failed: {exc}")
    for h in hosts:
        stop_host(h)
    # namespaces of ours that the state does not know about (e.g. a crashed `up`)
    known = {net.netns_name(h["name"]) for h in hosts}
    for ns in net.our_netns():
        if ns not in known:
            host = ns[len(net.NETNS_PREFIX) :]
            stop_host({"name": host, "ip": ""})
    for h in hosts:
        umount_disk(h["name"])
    for mnt in our_mounts():
        run(["umount", "-l", mnt], check=False)
    for h in hosts:
        net.host_down(h["name"])
    for ns in net.our_netns():
        net.host_down(ns[len(net.NETNS_PREFIX) :])
    for link in net.our_veths():
        run(["ip", "link", "del", link], check=False, quiet=True)
    net.bridge_down()
    if wipe:
        for h in hosts:
            shutil.rmtree(host_dirs(h["name"])["top"], ignore_errors=True)

    def mark(d: dict) -> None:
        d["up"] = False
        d["down_since"] = time.time()
        for h in d.get("hosts", []):
            h["supervisor_pid"] = None

    if data:
        st.update(mark)
    left = {k: v for k, v in leftovers().items() if v}
    if left:
        log(f"down: LEFTOVERS {left}")
    else:
        log(f"down: clean in {time.monotonic() - t0:.2f} s")
    return leftovers()


def get_host(name: str) -> dict:
    data = st.load()
    if not st.is_up(data):
        raise LabError(f"the simulated lab is not up: run `{st.cli('up')}`")
    for h in data["hosts"]:
        if h["name"] == name or h["ip"] == name:
            return h
    names = ", ".join(h["name"] for h in data["hosts"])
    raise LabError(f"no host {name!r} in the lab ({names})")


@_locked
def reboot(name: str, *, wait: bool = True, timeout: float = 30) -> float:
    """Reboot like a real one: PID 1 gets SIGTERM and ends, the supervisor boots again.
    A powered-off host is powered on.

    Returns the seconds until sshd answered again (0 when not waiting).
    """
    h = get_host(name)
    t0 = time.monotonic()
    before = boots(h)
    pid1 = host_pid1(h)
    if (host_dirs(h["name"])["run"] / "powered-off").exists():
        log(f"{name}: powered off: pressing the power button")
        os.kill(h["supervisor_pid"], signal.SIGUSR1)
    elif pid1 is None:
        raise LabError(f"{name}: no running PID 1 (still booting?)")
    else:
        os.kill(pid1, signal.SIGTERM)
    if not wait:
        return 0.0
    deadline = time.monotonic() + timeout
    killed = False
    while boots(h) <= before:
        if time.monotonic() > t0 + 3 and not killed:
            unshare_pid = _read_int(host_dirs(name)["run"] / "unshare.pid")
            if unshare_pid and st.pid_alive(unshare_pid):
                log(f"{name}: PID 1 ignored SIGTERM: hard reset")
                os.kill(unshare_pid, signal.SIGKILL)
            killed = True
        if time.monotonic() > deadline:
            raise LabError(f"{name}: did not boot again within {timeout:.0f}s")
        time.sleep(0.02)
    _wait_ready([h], max(1.0, deadline - time.monotonic()))
    return time.monotonic() - t0


@_locked
def reinstall(name: str, *, keep_host_key: bool = False, timeout: float = 30) -> float:
    """OS reinstall: stop, drop the upper layer except /home, provision (a new ssh host key
    unless ``keep_host_key``), boot fresh."""
    h = get_host(name)
    t0 = time.monotonic()
    data = st.load()
    specs = [spec_from_state(x) for x in data["hosts"]]
    spec = next(s for s in specs if s.name == h["name"])
    stop_host(h)
    umount_disk(spec.name)
    wipe_upper(spec.name, keep=("home",))
    if not keep_host_key:  # provision() generates the new one; `up` writes it to known_hosts
        for stale in (st.HOSTKEYS_DIR / spec.name, st.HOSTKEYS_DIR / f"{spec.name}.pub"):
            stale.unlink(missing_ok=True)
    mount_disk(spec.name)
    provision(spec, specs)
    pid = start_supervisor(spec)

    def record(d: dict) -> None:
        for x in d["hosts"]:
            if x["name"] == spec.name:
                x["supervisor_pid"] = pid
                x["reinstalled_at"] = time.time()

    st.update(record)
    _wait_ready([h], timeout)
    log(f"{name}: reinstalled in {time.monotonic() - t0:.2f} s")
    return time.monotonic() - t0


def ssh_argv(
    h: dict, command: list[str] | str | None = None, tty: bool = False, user: str = "root"
) -> list[str]:
    argv = [
        "ssh", "-i", str(st.SSH_KEY), "-o", "IdentitiesOnly=yes",
        "-o", f"UserKnownHostsFile={st.KNOWN_HOSTS}", "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR",
    ]  # fmt: skip
    argv += ["-t"] if tty else ["-T"]
    argv.append(f"{user}@{h['ip']}")
    if command:
        argv += [command] if isinstance(command, str) else list(command)
    return argv
