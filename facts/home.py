"""Files in the training user's home, read as that user (never root): what an upload there
would replace (``operations.util.as_user.put_as``).

Root's ``File``/``Sha1File`` of a path the user controls follows a symlink the user planted
and hangs on a FIFO (security review N1, N6); this fact runs as the user, reads a regular file
only (``[ -f ] && [ ! -L ]``), with a time bound, and answers in a few bytes.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase
from typing_extensions import override

from p40fleet.jsonable import ToJson
from p40fleet.privdrop import READ_TIMEOUT_S, as_user_script

__all__ = ["UserFile", "UserFileState"]

_MARK = "@@p40fleet-userfile"


@dataclass(frozen=True)
class UserFileState(ToJson):
    """``kind``: ``missing``, ``file``, ``link``, ``dir`` or ``other`` (a FIFO, a device);
    for a regular file its octal ``mode`` (as ``File`` gives it: ``644``), owner and sha1."""

    kind: str = "missing"
    mode: int | None = None
    owner: str | None = None
    sha1: str | None = None


class UserFile(FactBase[UserFileState]):
    """
    Returns ``UserFileState`` of ``path`` as the training user ``user`` sees it.
    """

    @staticmethod
    @override
    def default() -> UserFileState:
        return UserFileState()

    @override
    def command(self, path: str, user: str) -> str:
        p = shlex.quote(path)
        script = (
            f"if [ -L {p} ]; then echo '{_MARK} link'; "
            f"elif [ -d {p} ]; then echo '{_MARK} dir'; "
            f"elif [ -f {p} ]; then echo \"{_MARK} file $(stat -c '%a %U' {p})\"; "
            f"timeout {READ_TIMEOUT_S} sha1sum -- {p} </dev/null | cut -c1-40; "
            f"elif [ -e {p} ]; then echo '{_MARK} other'; "
            f"else echo '{_MARK} missing'; fi; true"
        )
        return as_user_script(user, script, f"echo '{_MARK} missing'")

    @override
    def process(self, output: list[str]) -> UserFileState:
        lines = [line.strip() for line in output]
        if not lines or not lines[0].startswith(_MARK):
            return UserFileState()
        head = lines[0][len(_MARK) :].split()
        kind = head[0] if head else "missing"
        if kind != "file":
            return UserFileState(kind=kind if kind in ("link", "dir", "other") else "missing")
        mode = int(head[1]) if len(head) > 1 and head[1].isdigit() else None
        owner = head[2] if len(head) > 2 else None
        sha1 = lines[1] if len(lines) > 1 and len(lines[1]) == 40 else None
        return UserFileState(kind="file", mode=mode, owner=owner, sha1=sha1)
