"""Per-host supervisor: boots a lab host and boots it again whenever its PID 1 exits.

    python -m p40lab.supervisor NAME NETNS ROOT RUNDIR

Started by ``up`` in its own session; its PID is recorded in the state file and in
``RUNDIR/supervisor.pid``. Each boot: the boot hook (:func:`p40lab.boot.apply_hook`), then
``ip netns exec NETNS unshare --mount --pid --uts --ipc --time --boottime -<uptime> --fork
--kill-child=SIGKILL ... sh INIT_SCRIPT`` whose PID (the ``unshare``) goes to
``RUNDIR/unshare.pid``.
The time namespace starts CLOCK_BOOTTIME near 0, so ``/proc/uptime`` drops like after a real
reboot. ``RUNDIR/boots`` counts boots, ``RUNDIR/boot-time`` is the wall clock of the last one.
SIGTERM (or ``RUNDIR/stop``) ends the host and the supervisor. When
``/var/lib/p40lab-sim/poweroff`` appears in its rootfs (``poweroff`` inside) the host stays off
(``RUNDIR/powered-off``) until SIGUSR1 (power button: ``p40lab reboot HOST``) boots it again.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from p40lab.boot import INIT_SCRIPT, POWEROFF_FLAG, apply_hook

PR_SET_CHILD_SUBREAPER = 36
CLEAN_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
}


def log(msg: str) -> None:
    print(f"[supervisor {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def become_subreaper() -> None:
    """Orphans of the host (its PID 1 and what it leaves behind) are reaped here."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def reap_all(timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.01)


def main(argv: list[str]) -> int:
    name, netns, root_s, rundir_s = argv
    root, rundir = Path(root_s), Path(rundir_s)
    stop = rundir / "stop"
    child: list[subprocess.Popen] = []
    stopping = False

    def on_term(signum, frame):
        nonlocal stopping
        stopping = True
        for proc in child:
            try:
                proc.kill()  # unshare; --kill-child takes PID 1 and its pid namespace along
            except ProcessLookupError:
                pass

    power_on: list[bool] = []
    become_subreaper()
    signal.signal(signal.SIGUSR1, lambda signum, frame: power_on.append(True))
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    _write(rundir / "supervisor.pid", f"{os.getpid()}\n")
    boots = 0
    fast_fails = 0
    while not stopping and not stop.exists():
        boots += 1
        flag = root / POWEROFF_FLAG
        flag.unlink(missing_ok=True)
        decision = apply_hook(root, rundir / "modules")
        log(
            f"{name}: boot {boots}: kernel={decision['kernel']} nouveau={decision['nouveau']} "
            f"nvidia={decision['nvidia']}"
        )
        uptime = int(float(Path("/proc/uptime").read_text().split()[0]))
        cmd = [
            "ip", "netns", "exec", netns,
            "unshare", "--mount", "--pid", "--uts", "--ipc", "--fork", "--kill-child=SIGKILL",
            "--propagation", "private", f"--mount-proc={root}/proc",
            "--time", "--boottime", f"-{uptime}",
            "/bin/sh", "-ec", INIT_SCRIPT, "p40lab-init",
            str(root), name, str(rundir / "modules"), decision["nvidia"] or "", str(boots),
            decision["kernel"],
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, env=CLEAN_ENV, stdin=subprocess.DEVNULL)
        child[:] = [proc]
        _write(rundir / "unshare.pid", f"{proc.pid}\n")
        _write(rundir / "boot-time", f"{time.time()}\n")
        _write(rundir / "boots", f"{boots}\n")
        started = time.monotonic()
        if stopping:
            proc.kill()
        rc = proc.wait()
        child.clear()
        reap_all(0.5 if stopping else 0.05)
        (rundir / "unshare.pid").unlink(missing_ok=True)
        if stopping or stop.exists():
            break
        if flag.exists():
            log(f"{name}: powered off (SIGUSR1 powers it on)")
            flag.unlink(missing_ok=True)
            (rundir / "powered-off").touch()
            power_on.clear()
            while not stopping and not stop.exists() and not power_on:  # stay "off"
                time.sleep(0.1)
            (rundir / "powered-off").unlink(missing_ok=True)
            continue
        fast_fails = fast_fails + 1 if time.monotonic() - started < 2 and rc != 0 else 0
        delay = min(0.2 * 2**fast_fails, 10.0) if fast_fails else 0.2
        log(f"{name}: PID 1 exited (rc={rc}): rebooting in {delay:.1f} s")
        time.sleep(delay)
    reap_all(2.0)
    log(f"{name}: supervisor exits")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
