"""Commands run as the training user: root never acts inside that user's files.

:func:`as_user` wraps a command in ``su``; :func:`mkdir_as` makes a directory as the user;
:func:`put_as` writes a file under the user's home as the user (root stages it outside);
:func:`write_as` writes a short text there (a marker) as the user, a new file renamed into
place (:func:`replace_text`).
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Iterator
from io import BytesIO
from typing import Any

from pyinfra import host
from pyinfra.api import FileUploadCommand, QuoteString, StringCommand
from pyinfra.facts.files import Directory

from p40fleet.facts.survey import ask
from p40fleet.privdrop import STAGE_DIR, copy_in_script

__all__ = ["as_user", "mkdir_as", "put_as", "replace_text", "write_as"]


def as_user(user: str | None, command: StringCommand) -> StringCommand:
    """``command`` run as ``user`` through ``su`` (unchanged when ``user`` is None).

    Used instead of pyinfra's ``_su_user`` so that facts keep running as the connecting user:
    on a fresh host the training user does not exist yet while facts are gathered.
    """
    if not user:
        return command
    return StringCommand("su -s /bin/sh", QuoteString(user), "-c", QuoteString(command))


def mkdir_as(user: str, path: str):
    """Yield ``mkdir -p path`` as ``user`` when ``path`` is not a directory yet: an upload into
    the user's home then leaves no root-owned parent (``files.put`` would create the parents as
    root and chown only the last)."""
    if not ask(host, Directory, path=path):
        yield as_user(user, StringCommand("mkdir -p", QuoteString(path)))


def put_as(user: str, content: bytes | str, dest: str, mode: str = "644") -> Iterator[Any]:
    """Yield the commands that make ``dest`` (under the training user's home) hold ``content``
    with ``mode``, written by ``user``: root uploads it into its own 0700 ``STAGE_DIR`` and
    streams it to ``user``'s copy (temp file, rename over ``dest``), then removes its copy.
    Root never opens, chowns or chmods ``dest`` (N1); a link there is replaced, not followed.
    ``content``: the bytes, or the path of a local file."""
    # named after dest (a local file, e.g. the Apex wheel, may not exist until this run builds it)
    name = hashlib.sha1(dest.encode()).hexdigest()[:16]
    staged = posixpath.join(STAGE_DIR, f"{name}-{posixpath.basename(dest)}")
    yield StringCommand("install -d -m 700", QuoteString(STAGE_DIR))
    yield FileUploadCommand(
        content if isinstance(content, str) else BytesIO(content),
        staged,
        remote_temp_filename=host.get_temp_filename(staged),
    )
    yield StringCommand(
        as_user(user, StringCommand(copy_in_script(dest, mode))),
        "<", QuoteString(staged), "; rc=$?; rm -f", QuoteString(staged), "; exit $rc",
    )  # fmt: skip


def replace_text(dest: str, *lines: str, mode: str = "644") -> StringCommand:
    """``dest`` made to hold ``lines``, one a line: ``printf`` into a temporary file beside it,
    renamed over it (a new inode: a write in place would go through every hard link of the old
    file, as a lab clone shares its seed's). Run it as the user (:func:`write_as`)."""
    return StringCommand(
        "printf '%s\\n'", *(QuoteString(line) for line in lines),
        "| (", copy_in_script(dest, mode), ")",
    )  # fmt: skip


def write_as(user: str | None, dest: str, *lines: str, mode: str = "644") -> StringCommand:
    """:func:`replace_text` of ``dest`` (under the training user's home), run as ``user``."""
    return as_user(user, replace_text(dest, *lines, mode=mode))
