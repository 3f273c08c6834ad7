"""Get nouveau out of the way of the NVIDIA driver: blacklist, initramfs, reboot (if allowed).

The driver runfile aborts while nouveau is loaded. A blacklist alone changes nothing until the
initramfs is rebuilt (``update-initramfs -u``) and the host has rebooted.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, operation
from pyinfra.facts.server import Which

from p40fleet.facts.nouveau import FileStampFact, InitramfsMtime, NouveauLoaded
from p40fleet.facts.survey import Part, ask, part
from p40fleet.operations import run_lock
from p40fleet.operations.refuse import refuse
from p40fleet.operations.util.reboot import rebooted
from p40fleet.spec import StackSpec

__all__ = ["BLACKLIST_FILE", "BLACKLIST_TEXT", "blacklist", "initramfs", "unloaded", "survey_parts"]

BLACKLIST_FILE = "/etc/modprobe.d/blacklist-nouveau.conf"
BLACKLIST_TEXT = "blacklist nouveau\noptions nouveau modeset=0\n"

REBOOT_DELAY_S = 2
REBOOT_TIMEOUT_S = 600


@operation()
def blacklist(path: str = BLACKLIST_FILE):
    """
    Write the nouveau blacklist (``blacklist nouveau`` + ``options nouveau modeset=0``).

    + path: the modprobe.d file; rewritten only when its content differs
    """
    current = ask(host, FileStampFact, path=path)
    if current is not None and current.text == BLACKLIST_TEXT:
        host.noop(f"{path} already blacklists nouveau")
        return
    yield StringCommand(
        "mkdir -p /etc/modprobe.d && printf '%s\\n'",
        *(QuoteString(line) for line in BLACKLIST_TEXT.splitlines()),
        ">",
        QuoteString(path),
    )


@operation()
def initramfs(path: str = BLACKLIST_FILE):
    """
    Rebuild the initramfs (``update-initramfs -u``) when the blacklist is newer than it.

    + path: the blacklist file whose mtime is compared with the initramfs'
    """
    stamp = ask(host, FileStampFact, path=path)
    if stamp is None:
        host.noop(f"no {path}: nothing to put into the initramfs")
        return
    built = ask(host, InitramfsMtime)
    if built is not None and built >= stamp.mtime:
        host.noop("the initramfs is newer than the nouveau blacklist")
        return
    if not ask(host, Which, command="update-initramfs"):
        yield from refuse._inner(
            step="nouveau blacklist",
            reason="update-initramfs is not installed: the blacklist cannot reach the initramfs",
            remedy="install initramfs-tools (apt-get install initramfs-tools), then re-run",
        )
        return
    yield "update-initramfs -u"


@operation(is_idempotent=False)
def unloaded(
    allow_reboot: bool = False,
    delay: int = REBOOT_DELAY_S,
    reboot_timeout: int = REBOOT_TIMEOUT_S,
):
    """
    Make sure nouveau is not loaded: reboot (and confirm) when allowed, else fail this host.

    + allow_reboot: ``spec.policy.allow_reboot``
    + delay: seconds before the first reconnect attempt
    + reboot_timeout: give up reconnecting after this many seconds
    """
    if not ask(host, NouveauLoaded):
        host.noop("nouveau is not loaded")
        return
    if not allow_reboot:
        yield from refuse._inner(
            step="driver install",
            reason=(
                "reboot required: nouveau is loaded; it is blacklisted and the initramfs "
                "rebuilt, but only a reboot unloads it (the NVIDIA installer aborts until then)"
            ),
            remedy="run with allow_reboot=True or reboot it yourself, then re-run",
        )
        return
    yield from rebooted(delay=delay, interval=1, reboot_timeout=reboot_timeout)
    yield from run_lock.refreshed()  # this run's lock now names the new boot

    def _confirm_nouveau_gone(state, host) -> bool:  # noqa: ARG001 - pyinfra's signature
        if ask(host, NouveauLoaded):
            host.log_styled(
                f"host {host.name}: nouveau is still loaded after the reboot — fix: check "
                f"{BLACKLIST_FILE} and that update-initramfs -u succeeded, then re-run",
                fg="red",
            )
            return False
        return True

    yield FunctionCommand(_confirm_nouveau_gone, (), {})


def survey_parts(spec: StackSpec) -> list[Part]:  # noqa: ARG001 - the same for every spec
    """The facts this module's operations ask on a converged host (``operations.run.survey``)."""
    return [part(FileStampFact, path=BLACKLIST_FILE), part(InitramfsMtime), part(NouveauLoaded)]
