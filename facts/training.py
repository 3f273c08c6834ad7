"""Facts about a host's training inputs: a staged model or data directory, the model's config.

Both are read-only and never fail the host: a missing directory or file is an answer. They read
the training user's files as that user (``p40fleet.privdrop``), a bounded number of bytes, and
never through a symlink.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase
from typing_extensions import override

from p40fleet.jsonable import ToJson
from p40fleet.privdrop import as_user_script
from p40fleet.training import MARKER

__all__ = ["CONFIG_LIMIT", "ModelConfig", "StagedDir", "StagedDirState"]

#: Bytes of a model's config.json a fact reads (a transformers config is a few KB).
CONFIG_LIMIT = 65536


@dataclass(frozen=True)
class StagedDirState(ToJson):
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
    def command(self, path: str, user: str) -> str:
        d = shlex.quote(path.rstrip("/") or "/")
        m = f"{d}/{shlex.quote(MARKER)}"
        script = (
            f"if [ -d {d} ]; then echo exists=yes; "
            f'if [ -f {m} ] && [ ! -L {m} ]; then echo "marker=$(head -c 4096 {m} | head -n 1)"; '
            f'fi; for f in {d}/* {d}/.[!.]*; do [ -f "$f" ] && [ -s "$f" ] && '
            'echo "file=${f##*/}"; done | head -n 1000; else echo exists=no; fi; true'
        )
        return as_user_script(user, script, "echo exists=no")

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
    def command(self, path: str, user: str) -> str:
        f = shlex.quote(f"{path.rstrip('/')}/config.json")
        script = f"if [ -f {f} ] && [ ! -L {f} ]; then head -c {CONFIG_LIMIT} {f}; fi; true"
        return as_user_script(user, script)

    @override
    def process(self, output: list[str]) -> dict | None:
        try:
            data = json.loads("\n".join(output))
        except ValueError:
            return None
        return data if isinstance(data, dict) else None
