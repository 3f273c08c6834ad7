"""Where the controller (the machine running pyinfra) keeps p40fleet's own files."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

CACHE_ENV = "P40FLEET_CACHE"
#: The controller's id for the run lock (``p40fleet.run_lock``): in the cache dir, made once,
#: one file per machine (:func:`id_path`).
ID_FILE = "controller-id"
#: What tells one machine from another under a shared cache dir (an NFS home).
MACHINE_ID = Path("/etc/machine-id")
_ID = re.compile(r"[0-9a-f]{32}")


def cache_dir() -> Path:
    """``$P40FLEET_CACHE``, else ``~/.cache/p40fleet`` (Apex wheels)."""
    return Path(os.path.expanduser(os.environ.get(CACHE_ENV) or "~/.cache/p40fleet"))


def sha256_file(path: str | os.PathLike[str]) -> str:
    """sha256 of a local file, read in 1 MiB chunks (wheels and keys on the controller)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _machine() -> str:
    try:
        return MACHINE_ID.read_text().strip()
    except OSError:
        return ""


def id_path() -> Path:
    """``controller-id.M`` in :func:`cache_dir`, M from this machine's ``/etc/machine-id``: two
    machines sharing one cache dir (an NFS home) keep two ids, so neither takes the other's live
    lock for a crashed run of its own (it looks for the holder's pid on its own machine)."""
    machine = hashlib.sha256(_machine().encode()).hexdigest()[:12]
    return cache_dir() / f"{ID_FILE}.{machine}"


def controller_id() -> str:
    """Who this controller is, for the hosts' run lock: a random id (32 hex) kept in
    :func:`id_path`, made on first use. Not the hostname: cloned VMs and laptops share one,
    and a lock of a live run elsewhere would then look like a crashed run here.

    Where the cache cannot be written, the id is derived from ``/etc/machine-id`` and the uid
    instead (stable on this machine; a clone that kept its machine-id shares it)."""
    path = id_path()
    for _attempt in range(2):
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            text = None
        except OSError:
            break
        if text is not None and _ID.fullmatch(text):
            return text
        try:  # absent (or garbled): write one; of two made at once the first link wins
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{ID_FILE}.{os.getpid()}")
            tmp.write_text(os.urandom(16).hex() + "\n")
            os.chmod(tmp, 0o600)
            try:
                if text is None:
                    os.link(tmp, path)
                else:
                    os.replace(tmp, path)
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        except OSError:
            break
    return hashlib.sha256(f"{_machine()}:{os.getuid()}".encode()).hexdigest()[:32]
