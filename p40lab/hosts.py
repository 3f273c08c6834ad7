"""Lab hosts: the lifecycle (up, down, reboot, reinstall, under the lab lock) and ssh.

The parts live beside it: :mod:`p40lab.plan` (HostSpec, plan), :mod:`p40lab.disks` (overlay
disks, provisioning: identity files, doubles, fake PCI, host keys) and :mod:`p40lab.procs`
(supervisor, stop, uptime, boots, readiness).

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
  the system doubles (``p40lab.doubles.install_system_doubles``: update-initramfs,
  systemctl, the uname shim, apt sources = the unreachable archive; no dkms: the deploy
  installs it from the mirror), the fake PCI tree (:mod:`p40lab.fakehw`),
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
import os
import shutil
import signal
import time
import traceback
from pathlib import Path

from p40lab import base, firewall, httpd, net
from p40lab import mirror as lab_mirror
from p40lab import state as st
from p40lab.boot import kernel_release
from p40lab.disks import (
    ensure_controller_key,
    is_mounted,
    mount_disk,
    our_mounts,
    provision,
    umount_disk,
    wipe_upper,
    write_known_hosts,
)
from p40lab.plan import HostSpec, host_dirs, spec_from_state
from p40lab.procs import (
    boots,
    host_pid1,
    lab_processes,
    read_int,
    start_supervisor,
    stop_host,
    wait_ready,
)
from p40lab.state import LabError
from p40lab.util import log, run

# --------------------------------------------------------------------------- mirror hook


def mirror_hook(action: str, data: dict | None = None) -> None:
    """Start or stop this instance's artifact mirror.

    ``start``: ``mirror.ensure_mirror(state)`` (state = the lab state dict, see p40lab.state;
    it publishes pins with ``p40lab.state.set_stack_overrides``) then ``httpd.start_server()``
    (this instance's mirror dir, bound to its controller address only: 10.231.0.1:8111 for the
    default instance); ``stop``: ``httpd.stop_server()``.
    """
    step = "p40lab.mirror.ensure_mirror"
    httpd.UPSTREAM_OPEN.unlink(missing_ok=True)  # a route out lasts one up at most
    try:
        if action == "start":
            t0 = time.monotonic()
            lab_mirror.ensure_mirror(data)
            step = "p40lab.httpd.start_server"
            httpd.start_server()
            log(f"mirror ready on {st.MIRROR_URL} ({time.monotonic() - t0:.1f} s)")
        else:
            step = "p40lab.httpd.stop_server"
            httpd.stop_server()
    except Exception as exc:
        log("".join(traceback.format_exc()).rstrip())
        hint = " (`up --no-mirror` starts the lab without it)" if action == "start" else ""
        raise LabError(f"{step} failed: {type(exc).__name__}: {exc}{hint}") from exc


# --------------------------------------------------------------------------- lab


def _locked(fn):
    """Run ``fn`` under the lab lock (one lab-changing command at a time)."""

    @functools.wraps(fn)
    def wrapper(*args, **kw):
        with st.lab_lock():
            return fn(*args, **kw)

    return wrapper


def leftovers() -> dict[str, list[str]]:
    """Everything of ours still present on the controller (empty lists when clean)."""
    data = st.load()
    procs = [str(p) for p in lab_processes()]
    for h in data.get("hosts", []):
        d = host_dirs(h["name"])
        for pid in (h.get("supervisor_pid"), read_int(d["run"] / "unshare.pid")):
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
        "mirror_pid": read_int(st.LAB_DIR / "mirror.pid"),
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
                if not is_mounted(old / "root"):
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
        wait_ready(data["hosts"], timeout)
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
        firewall.clear(h["name"])  # the netns takes it along; cleared first all the same
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


def host_key_fingerprints(name: str) -> list[tuple[str, str]]:
    """``(key type, SHA256:...)`` of each ``/etc/ssh/ssh_host_*_key.pub`` on the host's disk:
    what ``ssh-keygen -lf`` shows an admin at the host's console, not read over the network."""
    out = []
    for pub in sorted((Path(get_host(name)["root"]) / "etc/ssh").glob("ssh_host_*_key.pub")):
        kind, blob = pub.read_text().split()[:2]
        digest = hashlib.sha256(base64.b64decode(blob)).digest()
        out.append((kind, "SHA256:" + base64.b64encode(digest).decode().rstrip("=")))
    return out


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
            unshare_pid = read_int(host_dirs(name)["run"] / "unshare.pid")
            if unshare_pid and st.pid_alive(unshare_pid):
                log(f"{name}: PID 1 ignored SIGTERM: hard reset")
                os.kill(unshare_pid, signal.SIGKILL)
            killed = True
        if time.monotonic() > deadline:
            raise LabError(f"{name}: did not boot again within {timeout:.0f}s")
        time.sleep(0.02)
    wait_ready([h], max(1.0, deadline - time.monotonic()))
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
    wait_ready([h], timeout)
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
