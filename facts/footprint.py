"""What is at root-owned paths of the footprint (``p40fleet.footprint``), never following a link.

Like every fact here, the command exits 0 on any host and encodes what it saw in its output.
"""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase
from typing_extensions import override

__all__ = ["PathKinds"]


class PathKinds(FactBase[dict[str, str]]):
    """
    Returns ``{path: kind}`` for each of ``paths`` that exists: ``"link"`` (a symlink, never
    followed), ``"dir"`` or ``"file"`` (anything else); an absent path is not in the dict.
    """

    @staticmethod
    @override
    def default() -> dict[str, str]:
        return {}

    @override
    def command(self, paths: tuple[str, ...] | list[str]) -> str:
        quoted = " ".join(shlex.quote(p) for p in paths)
        return (
            f"for p in {quoted}; do "
            'if [ -L "$p" ]; then k=link; elif [ -d "$p" ]; then k=dir; '
            'elif [ -e "$p" ]; then k=file; else continue; fi; '
            'printf \'%s %s\\n\' "$k" "$p"; done; true'
        )

    @override
    def process(self, output: list[str]) -> dict[str, str]:
        out = {}
        for line in output:
            kind, _, path = line.partition(" ")
            if kind in ("link", "dir", "file") and path:
                out[path] = kind
        return out
