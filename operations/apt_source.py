"""The mirror's apt source (``stack.mirror.apt``), written before any apt install.

``mirror`` writes ``/etc/apt/sources.list.d/p40fleet-mirror.list`` (and ships the repository's
``signed-by`` key to ``/etc/apt/keyrings/``). On an air-gapped host (``stack.mirror.air_gapped``)
it also moves the distribution's own source files to ``/etc/apt/p40fleet-aside/``: apt would
otherwise try the unreachable archive on every ``apt-get update`` and fail (exit 100). They are
moved, not deleted: ``mv /etc/apt/p40fleet-aside/* back`` restores them once the host has a
route out. ``apt-get update`` runs only when something here changed.
"""

from __future__ import annotations

import os
from io import StringIO

from pyinfra import host
from pyinfra.api import FileUploadCommand, QuoteString, StringCommand, operation

from facts.apt_source import APT_DIR, MIRROR_KEY_DIR, MIRROR_LIST, AptSources
from facts.survey import ask
from operations import apt_lock
from p40fleet import controller
from p40fleet.proxy import proxied
from p40fleet.spec import Proxy

__all__ = ["ASIDE_DIR", "key_dest", "mirror", "source_line"]

#: Where an air-gapped host's own source files are moved (outside sources.list.d: apt ignores it).
ASIDE_DIR = f"{APT_DIR}/p40fleet-aside"


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
    + trusted: apt's ``[trusted=yes]`` (no signature check); only when the spec says so
    + air_gapped: move the other source files to ASIDE_DIR
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
        yield StringCommand("mkdir -p", QuoteString(ASIDE_DIR))
        for path in state.others:
            # numbered backups: a source moved aside twice (restored, then moved again) is kept
            yield StringCommand("mv --backup=numbered", QuoteString(path), QuoteString(ASIDE_DIR))
        host.log(f"air-gapped: moved {', '.join(state.others)} to {ASIDE_DIR}")
        changed.append("distribution sources moved aside")
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
