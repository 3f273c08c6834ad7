"""Artifact cache facts: a downloaded file, its verified marker, and who could have written them.

Free space is a host fact (``facts.host.FreeSpace``).

Like every fact here, the command exits 0 on any host and encodes what it saw in its output,
so gathering a fact never fails a host; a missing thing is ``None`` / ``False`` / empty.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase
from typing_extensions import override

from p40fleet.jsonable import ToJson

__all__ = [
    "ArtifactFile",
    "ArtifactState",
    "UnsafeParent",
    "marker_path",
    "parent_problem",
    "parents_command",
    "unsafe_owner",
]


def _q(path: str) -> str:
    return shlex.quote(path)


def _int_or_none(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def marker_path(path: str) -> str:
    """The verified marker kept next to a downloaded artifact: ``FILE.verified``."""
    return f"{path}.verified"


def unsafe_owner(uid: int | None, mode: int | None, writable_by: int = 0o022) -> str | None:
    """Why a path root trusts is not safe (``owned by uid 1000``, ``mode 0777``), or ``None``.

    ``writable_by`` is the mode bits that must be clear: group and others for files, others
    for the cache dir.
    """
    if uid is None or mode is None:
        return "owner and mode unknown"
    if uid != 0:
        return f"owned by uid {uid}, not root"
    if mode & writable_by:
        who = "group or others" if writable_by & 0o020 else "others"
        return f"mode {mode:04o} (writable by {who})"
    return None


def parents_command(path: str) -> str:
    """Shell: one line per existing directory from ``path`` up to ``/``, of the literal path
    and of its resolved one (``readlink -m``: a link's target dirs count too):
    ``pdir UID GID MODE PATH``, or ``plink UID PATH`` for a symbolic link."""
    q = _q(path)
    return (
        'p40w() { p=$1; while :; do if [ -L "$p" ]; then echo "plink $(stat -c %u -- "$p") $p"; '
        'elif [ -d "$p" ]; then echo "pdir $(stat -c \'%u %g %a\' -- "$p") $p"; fi; '
        '[ "$p" = / ] || [ "$p" = . ] && break; p=$(dirname -- "$p"); done; }; '
        f'p40w {q}; r=$(readlink -m -- {q} 2>/dev/null) && [ "$r" != {q} ] && p40w "$r"; '
    )


def parent_problem(output: list[str]) -> str | None:
    """The first directory of :func:`parents_command`'s lines through which an account other
    than root could rename the entries below it (S7), as ``PATH is ...``; None: all safe.

    Unsafe: owned by a uid other than 0 (its owner renames anything in it); group-writable
    by a group other than 0, or world-writable, without the sticky bit (``/tmp``'s 1777 is
    safe: only an entry's owner may rename it). A link owned by another uid (it can re-point
    it; its mode means nothing)."""
    for line in output:
        words = line.split(" ", 4)
        if words[0] == "plink" and len(words) >= 3:
            uid = _int_or_none(words[1])
            if uid != 0:
                return f"{line.split(' ', 2)[2]} is a symbolic link owned by uid {uid}, not root"
        elif words[0] == "pdir" and len(words) == 5:
            uid, gid = _int_or_none(words[1]), _int_or_none(words[2])
            mode, where = _octal_or_none(words[3]), words[4]
            if uid is None or gid is None or mode is None:
                return f"{where} is of unknown owner and mode"
            if uid != 0:
                return f"{where} is owned by uid {uid}, not root"
            sticky = bool(mode & 0o1000)
            if mode & 0o002 and not sticky:
                return f"{where} is mode {mode:04o} (others can rename its entries)"
            if mode & 0o020 and gid != 0 and not sticky:
                return f"{where} is mode {mode:04o}, group {gid} (that group can rename entries)"
    return None


class UnsafeParent(FactBase[str | None]):
    """
    Returns why another account than root could swap ``path`` (S7: it, or a directory above
    it, can be renamed by someone else; :func:`parent_problem`), or ``None``.

    Nothing missing is reported: a dir not made yet is created by root under the first one that
    exists, which is checked.
    """

    @override
    def command(self, path: str) -> str:
        return parents_command(path) + "true"

    @override
    def process(self, output: list[str]) -> str | None:
        return parent_problem(output)


@dataclass(frozen=True)
class ArtifactFile(ToJson):
    """A cached artifact and its marker line ``SIZE MTIME SHA256`` (from the last check).

    Also the owner (uid) and mode of the file, the marker and the cache dir: root runs these
    files, so one that another account could have written is never trusted on its marker (the
    defaults describe a root-owned cache; the fact fills them from ``stat``).
    """

    size: int | None = None
    mtime: int | None = None
    marker_size: int | None = None
    marker_mtime: int | None = None
    marker_sha256: str | None = None
    uid: int | None = 0
    mode: int | None = 0o644
    marker_uid: int | None = 0
    marker_mode: int | None = 0o644
    dir_uid: int | None = 0
    dir_mode: int | None = 0o755
    dir_present: bool = True
    #: why the cache dir or a directory above it could be renamed by another account (S7)
    parent_problem: str | None = None

    @property
    def present(self) -> bool:
        return self.size is not None

    @property
    def dir_problem(self) -> str | None:
        """Why the cache dir must not be used (not root's, or world-writable), or ``None``."""
        if not self.dir_present:
            return None
        return unsafe_owner(self.dir_uid, self.dir_mode, writable_by=0o002)

    @property
    def untrusted(self) -> str | None:
        """Why the marker cannot be believed without hashing (owner/mode), or ``None``."""
        for what, uid, mode, bits in (
            ("the cache dir", self.dir_uid, self.dir_mode, 0o002),
            ("the file", self.uid, self.mode, 0o022),
            ("its marker", self.marker_uid, self.marker_mode, 0o022),
        ):
            why = unsafe_owner(uid, mode, writable_by=bits)
            if why:
                return f"{what} is {why}"
        if self.parent_problem:
            return f"{self.parent_problem} (another account could swap the cache dir)"
        return None

    def verified(self, sha256: str) -> bool:
        """True when the marker was written for this very file (size, mtime) and this sum,
        and nobody but root could have written the file, the marker or the dir."""
        return (
            self.present
            and self.marker_sha256 == sha256.lower()
            and self.marker_size == self.size
            and self.marker_mtime == self.mtime
            and self.untrusted is None
        )


def _octal_or_none(text: str) -> int | None:
    return int(text, 8) if re.fullmatch(r"[0-7]{1,4}", text) else None


class ArtifactState(FactBase[ArtifactFile]):
    """
    Returns an ``ArtifactFile`` for ``path``: size, mtime, owner and mode of the file, the
    marker's content, owner and mode, the owner and mode of the directory, and whether
    anyone but root could rename it or a directory above it (:func:`parent_problem`).

    Never hashes anything: a re-run compares size + mtime with the marker only.
    """

    @staticmethod
    @override
    def default() -> ArtifactFile:
        return ArtifactFile()

    @override
    def command(self, path: str) -> str:
        f, m = _q(path), _q(marker_path(path))
        d = _q(posixpath.dirname(path.rstrip("/")) or "/")
        return (
            f"if [ -d {d} ]; then echo \"dir $(stat -c '%u %a' {d})\"; fi; "
            f"if [ -f {f} ]; then echo \"file $(stat -c '%s %Y %u %a' {f})\"; fi; "
            f"if [ -f {m} ]; then echo \"markerstat $(stat -c '%u %a' {m})\"; "
            f'echo "marker $(head -c 200 {m})"; fi; '
            + parents_command(posixpath.dirname(path.rstrip("/")) or "/")
            + "true"
        )

    @override
    def process(self, output: list[str]) -> ArtifactFile:
        values: dict[str, int | str | bool | None] = {
            "uid": None, "mode": None, "marker_uid": None, "marker_mode": None,
            "dir_uid": None, "dir_mode": None, "dir_present": False,
            "parent_problem": parent_problem([line for line in output if line.startswith("p")]),
        }  # fmt: skip
        for line in output:
            words = line.split()
            if len(words) == 3 and words[0] == "dir":
                values["dir_present"] = True
                values["dir_uid"], values["dir_mode"] = (
                    _int_or_none(words[1]),
                    _octal_or_none(words[2]),
                )
            elif len(words) in (3, 5) and words[0] == "file":
                values["size"], values["mtime"] = _int_or_none(words[1]), _int_or_none(words[2])
                if len(words) == 5:
                    values["uid"], values["mode"] = _int_or_none(words[3]), _octal_or_none(words[4])
            elif len(words) == 3 and words[0] == "markerstat":
                values["marker_uid"] = _int_or_none(words[1])
                values["marker_mode"] = _octal_or_none(words[2])
            elif len(words) == 4 and words[0] == "marker":
                values["marker_size"] = _int_or_none(words[1])
                values["marker_mtime"] = _int_or_none(words[2])
                if re.fullmatch(r"[0-9a-fA-F]{64}", words[3]):
                    values["marker_sha256"] = words[3].lower()
        return ArtifactFile(**values)  # type: ignore[arg-type]
