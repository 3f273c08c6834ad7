"""Where the controller (the machine running pyinfra) keeps p40fleet's own files."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "P40FLEET_CACHE"


def cache_dir() -> Path:
    """``$P40FLEET_CACHE``, else ``~/.cache/p40fleet`` (Apex wheels, fact plans)."""
    return Path(os.path.expanduser(os.environ.get(CACHE_ENV) or "~/.cache/p40fleet"))
