"""Where the controller (the machine running pyinfra) keeps p40fleet's own files."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

CACHE_ENV = "P40FLEET_CACHE"


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
