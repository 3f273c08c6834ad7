"""Lab host processes: each host's supervisor (which boots its PID 1, sshd), stopping a host,
its boots and uptime, readiness, and the lab's processes on the controller."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from p40lab import net
from p40lab import state as st
from p40lab.plan import HostSpec, host_dirs
from p40lab.state import LabError
from p40lab.util import log

# --------------------------------------------------------------------------- processes


def read_int(path: Path) -> int | None:
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
    sup = h.get("supervisor_pid") or read_int(d["run"] / "supervisor.pid")
    unshare_pid = read_int(d["run"] / "unshare.pid")
    recorded = [p for p in (sup, unshare_pid) if p]
    for pid in recorded:
        if st.pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):  # it exited since the check
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
    unshare_pid = read_int(host_dirs(h["name"])["run"] / "unshare.pid")
    if not unshare_pid:
        return None
    try:
        kids = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()
        return int(kids[0]) if kids else None
    except (OSError, ValueError):
        return None


def boots(h: dict) -> int:
    return read_int(host_dirs(h["name"])["run"] / "boots") or 0


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


def wait_ready(hosts: list[dict], timeout: float = 30.0) -> None:
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
