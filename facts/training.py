"""Facts about a host's training inputs: a staged model or data directory, the model's config.

Both are read-only and never fail the host: a missing directory or file is an answer.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase
from typing_extensions import override

from p40fleet.training import MARKER

__all__ = ["ModelConfig", "StagedDir", "StagedDirState"]


@dataclass(frozen=True)
class StagedDirState:
    """A directory: does it exist, the archive sum in its marker, its non-empty top files."""

    exists: bool = False
    marker: str | None = None
    files: tuple[str, ...] = ()


class StagedDir(FactBase[StagedDirState]):
    """
    Returns ``StagedDirState`` of ``path``: whether it is a directory, the first line of its
    ``.p40fleet-archive`` marker (the sha256 of the archive it was unpacked from) and the
    names of its non-empty regular top-level files.
    """

    @staticmethod
    @override
    def default() -> StagedDirState:
        return StagedDirState()

    @override
    def command(self, path: str) -> str:
        d = shlex.quote(path.rstrip("/") or "/")
        m = shlex.quote(MARKER)
        return (
            f"if [ -d {d} ]; then echo exists=yes; "
            f'if [ -f {d}/{m} ]; then echo "marker=$(head -n 1 {d}/{m})"; fi; '
            f'for f in {d}/* {d}/.[!.]*; do [ -f "$f" ] && [ -s "$f" ] && echo "file=${{f##*/}}"; '
            "done; else echo exists=no; fi; true"
        )

    @override
    def process(self, output: list[str]) -> StagedDirState:
        exists, marker, files = False, None, []
        for line in output:
            key, _, value = line.strip().partition("=")
            if key == "exists":
                exists = value == "yes"
            elif key == "marker":  # "SHA256  FILENAME": the sum is the first word
                marker = (value.split() or [None])[0]
            elif key == "file" and value:
                files.append(value)
        return StagedDirState(exists, marker, tuple(sorted(files)))


class ModelConfig(FactBase["dict | None"]):
    """
    Returns the parsed ``config.json`` of the model directory ``path`` (a dict), or None when
    it is missing or not a JSON object.
    """

    @staticmethod
    @override
    def default() -> None:
        return None

    @override
    def command(self, path: str) -> str:
        f = shlex.quote(f"{path.rstrip('/')}/config.json")
        return f"if [ -f {f} ]; then cat {f}; fi; true"

    @override
    def process(self, output: list[str]) -> dict | None:
        try:
            data = json.loads("\n".join(output))
        except ValueError:
            return None
        return data if isinstance(data, dict) else None
