"""Small helpers shared by the lab modules: logging, running commands, file digests."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from p40lab.state import LabError


def log(msg: str) -> None:
    print(f"[p40lab {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(
    cmd: Sequence[str], *, check: bool = True, quiet: bool = False, **kw
) -> subprocess.CompletedProcess:
    """Run a command; on failure raise LabError with its stderr (unless check=False)."""
    kw.setdefault("text", True)
    if quiet or check:
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
    try:
        proc = subprocess.run(list(cmd), **kw)
    except FileNotFoundError as exc:
        raise LabError(f"command not found: {cmd[0]}") from exc
    if check and proc.returncode != 0:
        err = (proc.stderr or proc.stdout or "").strip()
        raise LabError(f"`{' '.join(cmd)}` failed (rc={proc.returncode}): {err}")
    return proc


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks (the doubles and wheels run to GBs)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the simulated lab needs root (netns, overlayfs, mounts): run it as root")
