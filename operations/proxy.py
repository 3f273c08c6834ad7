"""``stack.proxy``'s credentials file on the host (:data:`p40fleet.proxy.PROXY_FILE`).

Written by the preflight, after its refusals and before the first fetch, only for a proxy with
a password (one without is passed inline: :func:`p40fleet.proxy.shell_prefix`); removed when
the spec no longer has one, so no stale password stays on the host.
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import File, Sha1File
from pyinfra.operations import files

from p40fleet.facts.survey import Part, ask, part
from p40fleet.operations.util.unchanged import same_file
from p40fleet.proxy import PROXY_DIR, PROXY_FILE, file_text
from p40fleet.run_record import run_record
from p40fleet.spec import Proxy, StackSpec

__all__ = ["credentials", "first_time", "survey_parts"]


@operation()
def credentials(proxy: Proxy | None = None):
    """
    Keep the proxy's credentials in a root:root 0600 file, or none when nothing needs them.

    + proxy: ``stack.proxy`` (None: no proxy)
    """
    if proxy is None or not proxy.has_secret:
        if ask(host, File, path=PROXY_FILE):
            yield from files.file._inner(path=PROXY_FILE, present=False)
        elif proxy is not None:
            host.noop("the proxy has no password: nothing to keep on the host")
        return
    yield from root_secret(PROXY_DIR, PROXY_FILE, file_text(proxy))


def first_time(state, host_name: str) -> bool:
    """True the first time a run asks for ``host_name`` (the preflight is included by every
    deploy of ``deploy/full.py``: its credentials step is queued once per host)."""
    done = run_record(state).proxy_queued
    if host_name in done:
        return False
    done.add(host_name)
    return True


def root_secret(directory: str, path: str, text: str):
    """Yield what makes ``path`` (in the root-only ``directory``) hold ``text``, root:root
    0600; nothing when it does. Never readable by others, not even between the upload and its
    chmod: the dir 0700, and the file made 0600 before the upload writes into it (pyinfra's
    sudo upload cp's into it, which keeps the mode). What stays: with sudo, pyinfra's temporary
    copy in its temp dir lives (as the connecting user, mode per its umask) for the upload's
    two commands."""
    if same_file(path, text.encode(), user="root", group="root", mode="600"):
        return
    yield StringCommand(
        "install -d -m 700 -o root -g root", QuoteString(directory),
        "&& ( umask 077 && touch", QuoteString(path), ") && chmod 600", QuoteString(path),
    )  # fmt: skip
    yield from files.put._inner(
        src=StringIO(text), dest=path, user="root", group="root", mode="600",
        add_deploy_dir=False,
    )  # fmt: skip


def survey_parts(spec: StackSpec) -> list[Part]:
    """The facts :func:`credentials` asks on a converged host (``operations.run.survey``)."""
    parts = [part(File, path=PROXY_FILE)]
    if spec.proxy is not None and spec.proxy.has_secret:
        parts.append(part(Sha1File, path=PROXY_FILE))  # root_secret's same_file
    return parts
