"""Guards that decide "nothing to do" for an upload from the survey's answers.

pyinfra's ``files.put``/``files.template``/``files.directory`` ask their facts with
``host.get_fact`` each time, so without these a converged host would be asked live on every
upload. :func:`same_file`, :func:`same_dir` restate pyinfra's own decision (sha1, owner, group,
mode) and no-op wording; :func:`same_user_file` is the same for a file written as the training
user (``operations.util.as_user.put_as``); :func:`rendered` is the text ``files.template``
would upload.
"""

from __future__ import annotations

import hashlib
from typing import Any

from pyinfra import host, state
from pyinfra.facts.files import Directory, File, Sha1File

from p40fleet.facts.home import UserFile
from p40fleet.facts.survey import ask
from p40fleet.runtime.templates import get_template

__all__ = ["rendered", "same_dir", "same_file", "same_user_file"]


def _mode(mode: Any) -> int | None:
    """A mode as pyinfra's ``File``/``Directory`` facts give it (``"644"`` -> ``644``)."""
    return None if mode is None else int(str(mode), 10)


def same_file(
    dest: str, content: bytes, user: str | None = None, group: str | None = None, mode: Any = None
) -> bool:
    """``dest`` is a file with exactly ``content``, owner, group and mode (those given): what
    ``files.put`` would leave unchanged (said as it says it). False when unsure: ``files.put``
    then decides."""
    info = ask(host, File, path=dest)
    if not info:
        return False
    if ask(host, Sha1File, path=dest) != hashlib.sha1(content).hexdigest():
        return False
    if user and info.get("user") != user or group and info.get("group") != group:
        return False
    if mode is not None and info.get("mode") != _mode(mode):
        return False
    host.noop(f"file {dest} is already uploaded")  # as files.put says it
    return True


def same_dir(
    path: str, user: str | None = None, group: str | None = None, mode: Any = None
) -> bool:
    """``path`` is a directory with this owner, group and mode (those given): what
    ``files.directory`` would leave unchanged."""
    info = ask(host, Directory, path=path)
    if not info:
        return False
    if user and info.get("user") != user or group and info.get("group") != group:
        return False
    if mode is not None and info.get("mode") != _mode(mode):
        return False
    host.noop(f"directory {path} already exists")  # as files.directory says it
    return True


def rendered(src: str, jinja_env_kwargs: dict | None = None, **data: Any) -> bytes:
    """The text ``files.template`` uploads for ``src`` (same data: host, state, inventory)."""
    data.setdefault("host", host)
    data.setdefault("state", state)
    data.setdefault("inventory", state.inventory)
    return get_template(src, jinja_env_kwargs).render(data).encode()


def same_user_file(dest: str, content: bytes, user: str, mode: Any = None) -> bool:
    """``dest`` is a regular file of ``user`` with exactly ``content`` (and ``mode``), as the
    user reads it (``facts.home.UserFile``, in the survey): nothing to upload."""
    info = ask(host, UserFile, path=dest, user=user)
    if info.kind != "file" or info.sha1 != hashlib.sha1(content).hexdigest():
        return False
    if info.owner != user or mode is not None and info.mode != int(str(mode), 10):
        return False
    host.noop(f"file {dest} is already uploaded")
    return True
