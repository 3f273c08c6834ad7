"""Test helper: the real verl 0.5.0 sdist from PyPI, downloaded once and cached.

Cache: ``$P40FLEET_TEST_CACHE`` or ``~/.cache/p40fleet-test/`` (reused across runs). The
download/extract code lives in ``p40lab.verl_remote`` (the lab's verl remote uses it too).
"""

from __future__ import annotations

import os
from pathlib import Path

from p40lab.verl_remote import VERL_VERSION, extract_sdist, fetch_verl_sdist


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "p40fleet-test"
    path = Path(os.environ.get("P40FLEET_TEST_CACHE", str(default)))
    path.mkdir(parents=True, exist_ok=True)
    return path


def verl_sdist(version: str = VERL_VERSION) -> Path:
    """Path of verl-<version>.tar.gz, fetched with ``pip download`` when not cached."""
    return fetch_verl_sdist(cache_dir(), version)


def extract_verl(dest: Path, version: str = VERL_VERSION) -> Path:
    """A fresh copy of the sdist tree at ``dest`` (must not exist; top directory stripped)."""
    return extract_sdist(verl_sdist(version), dest, version)
