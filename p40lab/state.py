"""Lab paths, constants and the state file.

The state file is JSON at ``$P40LAB_STATE`` or ``/var/lib/p40lab/state.json``::

    {
      "version": 1, "up": true, "up_since": 1700000000.0,
      "bridge": "labbr0", "controller_ip": "10.231.0.1", "subnet": "10.231.0.0/24",
      "base": "/var/cache/p40lab/base-bookworm", "lab_dir": "/var/lib/p40lab",
      "ssh_key": ".../id_ed25519", "ssh_pubkey": ".../id_ed25519.pub",
      "known_hosts": ".../known_hosts", "mirror_url": "http://10.231.0.1:8111",
      "hosts": [{"name": "lab1", "ip": "10.231.0.11", "layout": "4xP40",
                 "gpus": ["10de:1b38", ...], "os": "ubuntu20.04", "headers": true,
                 "root": ".../hosts/lab1/root", "upper": ".../hosts/lab1/upper",
                 "supervisor_pid": 1234}],
      "stack": {...}        # host data `stack` overrides for sim hosts (set_stack_overrides)
    }

Every change goes through :func:`update` (load, modify, save under an flock), so the
:func:`set_stack_overrides` of :func:`p40lab.mirror.ensure_mirror` during ``up`` is never
overwritten by a stale copy.
The file outlives ``down`` (``"up": false``, hosts kept for reference, ``stack`` kept).

Instances: ``$P40LAB_INSTANCE`` (unset: the default instance, the values above) names a lab of
its own, so two labs run side by side (``make test`` brings up instance ``test`` and never
touches the lab ``make demo`` left up). Instance ``X`` gets its own state dir
``/var/lib/p40lab-X``, bridge ``labbr-X``, subnet ``10.231.N.0/24`` (N from the name, 1..250;
``$P40LAB_NET=10.231.7`` overrides), netns ``p40lab-X-labN``, veths ``p4X-labN``, mirror dir
``/var/cache/p40lab/mirror-X`` served on its own controller address, and its own ssh keys.
Host names (``lab1``..) are the same in every instance: they are inventory names, local to
each instance's inventory. The base rootfs and the download cache under ``/var/cache/p40lab``
are shared (read-only once built).
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import re
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


class LabError(RuntimeError):
    """An error the CLI prints as one clear line (no traceback)."""


def _instance() -> str:
    name = os.environ.get("P40LAB_INSTANCE", "").strip()
    if name and not re.fullmatch(r"[a-z][a-z0-9]{0,5}", name):
        raise LabError(
            f"P40LAB_INSTANCE={name!r}: use 1-6 lowercase letters or digits, starting with a "
            "letter (it becomes part of interface names, at most 15 characters)"
        )
    return name


def _net(instance: str) -> str:
    """The instance's /24 as ``A.B.C``: 10.231.0 for the default, 10.231.(1..250) otherwise."""
    net = os.environ.get("P40LAB_NET", "").strip()
    if net:
        if not re.fullmatch(r"10\.\d{1,3}\.\d{1,3}", net):
            raise LabError(f"P40LAB_NET={net!r}: expected three octets of 10/8, e.g. 10.231.7")
        return net
    return f"10.231.{1 + zlib.crc32(instance.encode()) % 250}" if instance else "10.231.0"


INSTANCE = _instance()
_SUFFIX = f"-{INSTANCE}" if INSTANCE else ""
LAB_DIR = Path(os.environ.get("P40LAB_DIR", f"/var/lib/p40lab{_SUFFIX}"))
CACHE_DIR = Path(os.environ.get("P40LAB_CACHE", "/var/cache/p40lab"))
SUITE = "bookworm"
BASE_DIR = CACHE_DIR / f"base-{SUITE}"  # shared by every instance
MIRROR_DIR = CACHE_DIR / f"mirror{_SUFFIX}"  # per instance: fault tests corrupt and stop it

BRIDGE = f"labbr{_SUFFIX}" if INSTANCE else "labbr0"
NET = _net(INSTANCE)
CONTROLLER_IP = f"{NET}.1"
SUBNET = f"{NET}.0/24"
FIRST_HOST_OCTET = 11
HOST_PREFIX = "lab"
NETNS_PREFIX = f"p40lab{_SUFFIX}-"  # netns p40lab-lab1 (default), p40lab-test-lab1
VETH_PREFIX = f"p4{INSTANCE}-" if INSTANCE else "p4v"  # veth p4vlab1 (default), p4test-lab1
MIRROR_PORT = 8111  # every instance binds its own controller address: no clash
MIRROR_URL = f"http://{CONTROLLER_IP}:{MIRROR_PORT}"

SSH_KEY = LAB_DIR / "id_ed25519"
KNOWN_HOSTS = LAB_DIR / "known_hosts"
HOSTKEYS_DIR = LAB_DIR / "hostkeys"
HOSTS_DIR = LAB_DIR / "hosts"
RUN_DIR = LAB_DIR / "run"  # supervisor pid files, stop flags, boot counters, logs


def cli(command: str) -> str:
    """The shell command a message tells the user to run, for this instance."""
    env = f"P40LAB_INSTANCE={INSTANCE} " if INSTANCE else ""
    return f"{env}python -m p40lab {command}"


def state_path() -> Path:
    return Path(os.environ.get("P40LAB_STATE", str(LAB_DIR / "state.json")))


def host_ip(index: int) -> str:
    """lab1 -> 10.231.0.11 (index is 1-based)."""
    return f"{NET}.{FIRST_HOST_OCTET - 1 + index}"


def host_name(index: int) -> str:
    return f"{HOST_PREFIX}{index}"


def load() -> dict[str, Any]:
    """The state as a dict ({} when there is no state file)."""
    try:
        return json.loads(state_path().read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as exc:
        raise LabError(f"corrupt lab state {state_path()}: {exc}") from exc


def _save(data: dict[str, Any]) -> None:
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".state.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


_lab_lock_depth = 0


@contextlib.contextmanager
def lab_lock(timeout: float = 300.0) -> Iterator[None]:
    """Serialize lab-changing commands (up, down, reboot, reinstall) across processes.

    Re-entrant within a process (``up`` tears down through ``down`` when it fails).
    """
    global _lab_lock_depth
    if _lab_lock_depth:
        _lab_lock_depth += 1
        try:
            yield
        finally:
            _lab_lock_depth -= 1
        return
    LAB_DIR.mkdir(parents=True, exist_ok=True)
    with open(LAB_DIR / "lab.lock", "a+") as lock:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    lock.seek(0)
                    holder = lock.read().strip() or "?"
                    raise LabError(
                        f"another p40lab command (pid {holder}) is changing the lab; "
                        f"gave up after {timeout:.0f} s"
                    ) from None
                time.sleep(0.1)
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        _lab_lock_depth = 1
        try:
            yield
        finally:
            _lab_lock_depth = 0
            fcntl.flock(lock, fcntl.LOCK_UN)


def update(fn: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Load the state, let ``fn`` modify it in place, save it; returns a copy of the result."""
    with _locked():
        data = load()
        fn(data)
        _save(data)
        return copy.deepcopy(data)


def _deep_merge(dst: dict[str, Any], src: dict[str, Any]) -> None:
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _deep_merge(dst[key], value)
        else:
            dst[key] = copy.deepcopy(value)


def set_stack_overrides(overrides: dict[str, Any], *, replace: bool = False) -> dict[str, Any]:
    """Set host data ``stack`` for sim hosts (``inventories/sim.py`` reads ``state["stack"]``).

    Deep-merged into what is there unless ``replace``; returns the resulting stack dict.
    """

    def apply(data: dict[str, Any]) -> None:
        if replace or not isinstance(data.get("stack"), dict):
            data["stack"] = {}
        _deep_merge(data["stack"], overrides)

    return update(apply)["stack"]


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still answers kill(0): look at its state
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def is_up(data: dict[str, Any] | None = None) -> bool:
    data = load() if data is None else data
    return bool(data.get("up")) and bool(data.get("hosts"))
