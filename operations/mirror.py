"""The mirror on a host: its apt source (``stack.mirror.apt``), written before any apt install.

``mirror`` writes ``/etc/apt/sources.list.d/p40fleet-mirror.list`` (and ships the repository's
``signed-by`` key to ``/etc/apt/keyrings/``). On an air-gapped host (``stack.mirror.air_gapped``)
it also moves the distribution's own source files to ``/etc/apt/p40fleet-aside/``, each under
its own path (``p40fleet-aside/sources.list``, ``p40fleet-aside/sources.list.d/cuda.list``): apt
would otherwise try the unreachable archive on every ``apt-get update`` and fail (exit 100).
They are moved, not deleted, and a run with ``air_gapped: False`` moves every one back to where
it came from (one whose place is taken again is left aside, with a note). Both ways are decided
from what the fact sees on the host, so a second run changes nothing. ``apt-get update`` runs
only when something here changed.

The facts it decides from are in ``facts/mirror.py``. The mirror itself (the repository these
lines point at) is built and served on the controller by the package ``p40fleet.mirror``.
"""

from __future__ import annotations

import os
import posixpath
from io import StringIO

from pyinfra import host
from pyinfra.api import FileUploadCommand, QuoteString, StringCommand, operation

from p40fleet import controller
from p40fleet.facts.mirror import (
    APT_DIR,
    ASIDE_DIR,
    MIRROR_KEY_DIR,
    MIRROR_LIST,
    AptSources,
    aside_origin,
)
from p40fleet.facts.survey import Part, ask, part
from p40fleet.operations.util import apt_lock
from p40fleet.proxy import proxied
from p40fleet.spec import Proxy, StackSpec

__all__ = ["ASIDE_DIR", "aside_path", "key_dest", "mirror", "source_line", "survey_parts"]


def aside_path(path: str) -> str:
    """Where ``path`` (``/etc/apt/sources.list``, ``/etc/apt/sources.list.d/X``) goes aside."""
    return f"{ASIDE_DIR}/{path.removeprefix(APT_DIR + '/')}"


def key_dest(key_file: str) -> str:
    """The key's path on the host; the suffix is kept (apt reads ``.asc`` as armored)."""
    suffix = ".asc" if key_file.endswith(".asc") else ".gpg"
    return f"{MIRROR_KEY_DIR}/p40fleet-mirror{suffix}"


def source_line(
    url: str,
    suite: str,
    components: tuple[str, ...] | list[str] = (),
    key_file: str | None = None,
    trusted: bool = False,
) -> str:
    """The one-line-style ``deb`` entry: ``signed-by`` the shipped key, or ``trusted=yes``."""
    option = f"signed-by={key_dest(key_file)}" if key_file else "trusted=yes" if trusted else ""
    parts = ["deb", *([f"[{option}]"] if option else []), url, suite, *components]
    return " ".join(parts)


@operation()
def mirror(
    url: str,
    suite: str,
    components: tuple[str, ...] | list[str] = (),
    key_file: str | None = None,
    trusted: bool = False,
    air_gapped: bool = False,
    extra_suites: tuple[str, ...] | list[str] = (),
    proxy: Proxy | None = None,
    lock_wait_s: int = apt_lock.DEFAULT_TIMEOUT_S,
):
    """
    Point apt at the mirror; on an air-gapped host, at the mirror only.

    + url: the repository's base URL (``stack.mirror.apt.url``)
    + suite: e.g. ``focal``, or ``./`` for a flat repository
    + components: e.g. ``["main"]``; none for a flat repository
    + key_file: the repository's key on the controller (shipped as ``signed-by``)
    + trusted: apt's ``[trusted=yes]`` (no signature check); only when the spec says so. Over
      http that lets whoever is on the network path choose the packages root installs
    + air_gapped: move the other source files to ASIDE_DIR (False: move them back)
    + extra_suites: more suites of the same repository (one line each), e.g. ``focal-updates``
    + proxy: ``stack.proxy`` for ``apt-get update`` (None: no proxy)
    + lock_wait_s: how long ``apt-get update`` waits for the dpkg lock
      (``stack.policy.dpkg_lock_wait_s``)
    """
    dest = key_dest(key_file) if key_file else None
    state = ask(host, AptSources, key_path=dest)
    changed = []
    if key_file and dest:
        if not os.path.isfile(key_file):
            raise OSError(
                f"stack.mirror.apt.signed_by {key_file}: no such key file on the controller; "
                "export it there (gpg --export KEYID > FILE.gpg) and re-run"
            )
        if state.key_sha256 != controller.sha256_file(key_file):
            yield StringCommand("mkdir -p -m 755", QuoteString(MIRROR_KEY_DIR))
            yield FileUploadCommand(key_file, dest)
            yield StringCommand("chmod 644", QuoteString(dest))
            changed.append(f"key {dest}")
    text = (
        "# p40fleet: stack.mirror.apt (written by deploy/system.py; edits are replaced)\n"
        + "".join(
            source_line(url, one, components, key_file, trusted) + "\n"
            for one in (suite, *extra_suites)
        )
    )
    if (state.mirror_list or "").strip() != text.strip():
        yield FileUploadCommand(StringIO(text), MIRROR_LIST)
        yield StringCommand("chmod 644", QuoteString(MIRROR_LIST))
        changed.append(MIRROR_LIST)
    if air_gapped and state.others:
        dirs = sorted({posixpath.dirname(aside_path(path)) for path in state.others})
        yield StringCommand("mkdir -p", *(QuoteString(d) for d in dirs))
        for path in state.others:
            # numbered backups: a source moved aside twice (restored, then moved again) is kept
            yield StringCommand(
                "mv --backup=numbered -T", QuoteString(path), QuoteString(aside_path(path))
            )
        host.log(f"air-gapped: moved {', '.join(state.others)} to {ASIDE_DIR}")
        changed.append("distribution sources moved aside")
    if not air_gapped and state.aside:
        free = [rel for rel, is_free in state.aside if is_free]
        if free:
            dirs = sorted({posixpath.dirname(aside_origin(rel)) for rel in free})
            yield StringCommand("mkdir -p", *(QuoteString(d) for d in dirs))
        for rel in free:
            yield StringCommand(
                "mv -T", QuoteString(f"{ASIDE_DIR}/{rel}"), QuoteString(aside_origin(rel))
            )
        if free:
            where = ", ".join(aside_origin(rel) for rel in free)
            host.log(f"not air-gapped: moved {where} back from {ASIDE_DIR}")
            changed.append("distribution sources restored")
        for rel, is_free in state.aside:
            if not is_free:
                host.log(
                    f"not air-gapped: {ASIDE_DIR}/{rel} stays aside: {aside_origin(rel)} exists "
                    "again (compare them and remove the one you do not want)"
                )
    if not changed:
        host.noop(f"apt uses the mirror {url} {suite}".rstrip())
        return
    where = f"{url.rstrip('/')}/{suite}" if suite.endswith("/") else f"{url}/dists/{suite}"
    failed = (
        f"apt-get update failed with the mirror source {MIRROR_LIST} ({', '.join(changed)} "
        f"changed): check that {where}/Release answers from this host and is signed by the "
        "key in stack.mirror.apt.signed_by (a host with no route out needs "
        "stack.mirror.air_gapped: True), then re-run"
    )
    update = proxied(StringCommand("apt-get update -q", apt_lock.lock_option(apt_lock.REST)), proxy)
    yield apt_lock.guarded(update, host.name, "apt source", lock_wait_s, failed=failed)


def survey_parts(spec: StackSpec) -> list[Part]:
    """What :func:`mirror` asks on a converged host, with ``stack.mirror.apt`` (``operations.
    survey``)."""
    apt = spec.mirror.apt if spec.mirror is not None else None
    if apt is None:
        return []
    return [part(AptSources, key_path=key_dest(apt.signed_by) if apt.signed_by else None)]
