"""Undo what the deploys left on a host (``p40fleet.footprint``), each step decided by facts.

One operation per kind of undo (:data:`p40fleet.footprint.UNDO_KINDS`); :func:`undo` maps a
footprint item to its operation, and ``deploy/uninstall.py`` walks the footprint in
:data:`ORDER` (the Ray member stops before the driver and the env go; the driver's uninstaller
runs while its runfile is still cached). Nothing there: ``host.noop``, so a second uninstall
changes nothing.

The training user's home (``stack.policy.uninstall_home: remove``): root never acts inside
it. Its contents are deleted by the training user itself (``su``: ``find HOME -mindepth 1
-maxdepth 1 -exec rm -rf --one-file-system``): rm never follows a symlink (it removes the link),
and as that user a link to ``/etc`` or a bind mount of another disk could not reach a root file
anyway; ``--one-file-system`` leaves a mount inside the home alone (rm then fails, naming it).
Root then only ``rmdir``s the empty home (rmdir refuses a symlink and a non-empty dir) and runs
``userdel`` without ``-r`` (``-r`` would delete the home and the mail spool as root).
"""

from __future__ import annotations

import posixpath

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import File, Link
from pyinfra.facts.server import Groups, Users, Which

from p40fleet import footprint
from p40fleet.facts.driver import InstalledDriverVersion
from p40fleet.facts.footprint import PathKinds
from p40fleet.facts.mirror import ASIDE_DIR, AptSources, aside_origin
from p40fleet.facts.nouveau import FileStampFact
from p40fleet.facts.survey import ask
from p40fleet.footprint import BLACKLIST_FILE, MIRROR_KEYS, MIRROR_LIST, Item
from p40fleet.operations import ray
from p40fleet.operations.refuse import refuse
from p40fleet.operations.util.as_user import as_user
from p40fleet.ray import UNIT_NAME, UNIT_PATH
from p40fleet.spec import StackSpec

__all__ = [
    "HANDLED", "ORDER", "account_removed", "apt_aside_restored", "apt_mirror_removed",
    "cuda_link_removed", "driver_removed", "home_removed", "nouveau_restored", "path_removed",
    "ray_unit_removed", "undo",
]  # fmt: skip

#: The order deploy/uninstall.py undoes the footprint's kinds in.
ORDER = (
    "ray_unit", "driver", "cuda_link", "nouveau", "apt_mirror", "apt_aside", "account", "remove",
    "home", "released", "kept",
)  # fmt: skip


def _kinds(paths: tuple[str, ...], among: tuple[str, ...] = ()) -> dict[str, str]:
    """The kinds of ``paths``, asked as ``among`` (every path the uninstall looks at,
    :func:`watched`) when that holds them: one ``PathKinds`` command per host, not one per
    operation."""
    return ask(host, PathKinds, paths=among if set(paths) <= set(among) else tuple(paths))


def watched(spec: StackSpec) -> tuple[str, ...]:
    """Every path an uninstall operation asks the kind of, for ``spec``."""
    paths = {item.path(spec) for item in footprint.FOOTPRINT if item.undo in ("remove", "home")}
    paths |= {MIRROR_LIST, *MIRROR_KEYS, spec.user.home,
              posixpath.join(spec.paths.artifact_cache, spec.driver.filename)}  # fmt: skip
    return tuple(sorted(paths))


@operation()
def ray_unit_removed():
    """
    Stop, disable and remove ``p40fleet-ray.service`` (then ``systemctl daemon-reload``).
    """
    if not ask(host, File, path=UNIT_PATH):
        host.noop(f"no {UNIT_NAME}")
        return
    yield from ray.ray_left_out._inner(why="uninstall")


@operation()
def driver_removed(version: str, runfile: str, among: tuple[str, ...] = ()):
    """
    Uninstall the NVIDIA driver with its own uninstaller: ``nvidia-uninstall --silent``, else
    (the uninstaller deleted) ``sh RUNFILE --uninstall --silent`` when the cached runfile is
    the installed version's. A driver installed another way (apt) is left alone, said so.

    + version: the pinned version (its runfile is ``runfile``)
    + runfile: the runfile in the artifact cache
    + among: :func:`watched` (the paths asked about in one command)
    """
    installed = ask(host, InstalledDriverVersion)
    if ask(host, Which, command="nvidia-uninstall"):
        yield "nvidia-uninstall --silent"
    elif installed and installed == version and _kinds((runfile,), among).get(runfile) == "file":
        yield StringCommand("sh", QuoteString(runfile), "--uninstall --silent")
    elif installed:
        host.log(f"NVIDIA driver {installed} has no nvidia-uninstall: not a runfile install "
                 "(apt?), left as it is; remove it the way it was installed")  # fmt: skip
        host.noop(f"no runfile install of the NVIDIA driver (modinfo says {installed})")
        return
    else:
        host.noop("no NVIDIA driver installed")
        return
    host.log("NVIDIA driver uninstalled: the module stays loaded until the next reboot")


@operation()
def cuda_link_removed(cuda_link: str, cuda_dir: str):
    """
    Remove ``cuda_link`` while it is a symlink to ``cuda_dir``; anything else there is left.

    + cuda_link: ``stack.paths.cuda_link``
    + cuda_dir: ``stack.paths.cuda_dir``
    """
    info = ask(host, Link, path=cuda_link)
    if not info:
        host.noop(f"no {cuda_link}")
        return
    target = info.get("link_target") if isinstance(info, dict) else None
    if not target or posixpath.normpath(
        posixpath.join(posixpath.dirname(cuda_link), target)
    ) != posixpath.normpath(cuda_dir):
        what = f"a symlink to {target}" if target else "not a symlink"
        host.noop(f"{cuda_link} is {what}, not p40fleet's link to {cuda_dir}: left as it is")
        return
    yield StringCommand("rm -f", QuoteString(cuda_link))


@operation()
def path_removed(path: str, among: tuple[str, ...] = ()):
    """
    Remove ``path``, a root-owned file or tree of the footprint outside every home: a symlink
    itself (never what it points to), a tree with ``rm -rf --one-file-system``.

    + path: absolute path
    + among: :func:`watched` (the paths asked about in one command)
    """
    if not posixpath.isabs(path) or posixpath.normpath(path) in ("/", "/home", "/etc", "/usr"):
        raise ValueError(f"refusing to remove {path!r}: not a footprint path")
    kind = _kinds((path,), among).get(path)
    if kind is None:
        host.noop(f"no {path}")
        return
    if kind == "dir":
        yield StringCommand("rm -rf --one-file-system --", QuoteString(path))
    else:
        yield StringCommand("rm -f --", QuoteString(path))


@operation()
def nouveau_restored(path: str = BLACKLIST_FILE):
    """
    Remove the nouveau blacklist and rebuild the initramfs without it (``update-initramfs
    -u``, in the same command: a failed rebuild leaves the file for the next uninstall).

    + path: the modprobe.d file the deploy wrote
    """
    if ask(host, FileStampFact, path=path) is None:
        host.noop(f"no {path}")
        return
    if not ask(host, Which, command="update-initramfs"):
        yield StringCommand("rm -f", QuoteString(path))
        host.log("no update-initramfs: the blacklist is removed, rebuild the initramfs yourself")
        return
    yield StringCommand(
        "mv -f",
        QuoteString(path),
        QuoteString(path + ".p40fleet-removed"),
        "&& if update-initramfs -u; then rm -f",
        QuoteString(path + ".p40fleet-removed"),
        "; else mv -f",
        QuoteString(path + ".p40fleet-removed"),
        QuoteString(path),
        "; exit 1; fi",
    )
    host.log("nouveau blacklist removed: nouveau loads again after the next reboot")


@operation()
def apt_mirror_removed(among: tuple[str, ...] = ()):
    """
    Remove the mirror's apt source and its key. ``apt-get update`` is left to the admin: the
    restored archive may not answer from here.

    + among: :func:`watched` (the paths asked about in one command)
    """
    paths = (MIRROR_LIST, *MIRROR_KEYS)
    kinds = _kinds(paths, among)
    present = [p for p in paths if kinds.get(p)]
    if not present:
        host.noop(f"no {MIRROR_LIST}")
        return
    yield StringCommand("rm -f --", *(QuoteString(p) for p in present))
    host.log("the mirror's apt source is removed: run apt-get update once the archive answers")


@operation()
def apt_aside_restored():
    """
    Move each apt source the air-gapped deploy put in ``/etc/apt/p40fleet-aside`` back where
    it was; one whose place is taken again stays there, with a note. The emptied dir goes.
    """
    state = ask(host, AptSources, key_path=None)
    free = [rel for rel, is_free in state.aside if is_free]
    for rel, is_free in state.aside:
        if not is_free:
            host.log(f"{ASIDE_DIR}/{rel} stays aside: {aside_origin(rel)} exists again "
                     "(compare them and remove the one you do not want)")  # fmt: skip
    if not free:
        host.noop(f"nothing to move back from {ASIDE_DIR}")
        return
    dirs = sorted({posixpath.dirname(aside_origin(rel)) for rel in free})
    yield StringCommand("mkdir -p", *(QuoteString(d) for d in dirs))
    for rel in free:
        yield StringCommand(
            "mv -T", QuoteString(f"{ASIDE_DIR}/{rel}"), QuoteString(aside_origin(rel))
        )
    if len(free) == len(state.aside):
        # only empty dirs (and numbered backups of a source moved aside twice) are left
        yield StringCommand("find", QuoteString(ASIDE_DIR), "-depth -type d -empty -delete")
    host.log(f"moved {', '.join(aside_origin(rel) for rel in free)} back from {ASIDE_DIR}")


@operation()
def account_removed(account: str):
    """
    ``userdel`` the system account ``account`` when it exists (without ``-r``).

    + account: the account's name
    """
    if account not in ask(host, Users):
        host.noop(f"no account {account}")
        return
    yield StringCommand("userdel", QuoteString(account))


@operation()
def home_removed(user: str, home: str, policy: str, among: tuple[str, ...] = ()):
    """
    With ``policy`` ``remove``: delete the home's contents as ``user``, ``rmdir`` the home,
    ``userdel`` (no ``-r``) and remove the user's group. ``keep``: nothing.

    + user: the training user
    + home: its home
    + policy: ``stack.policy.uninstall_home``
    + among: :func:`watched` (the paths asked about in one command)
    """
    if policy != "remove":
        host.noop(f"{home} and the account {user} are kept (stack.policy.uninstall_home)")
        return
    exists = user in ask(host, Users)
    kind = _kinds((home,), among).get(home)
    if kind is not None and kind != "dir":
        yield from refuse._inner(
            step="uninstall home",
            reason=f"{home} is {'a symlink' if kind == 'link' else 'not a directory'}: root "
            "does not remove it",
            remedy=f"check {home} and remove it yourself, then re-run",
        )
        return
    if kind == "dir" and not exists:
        yield from refuse._inner(
            step="uninstall home",
            reason=f"{home} is there but the account {user} is not: its files can only be "
            "removed as their owner, and root does not act inside them",
            remedy=f"check {home} and remove it yourself, then re-run",
        )
        return
    if kind == "dir":
        empty_it = StringCommand(
            "find", QuoteString(home), "-mindepth 1 -maxdepth 1 -exec rm -rf --one-file-system",
            "-- {} +",
        )  # fmt: skip
        yield as_user(user, empty_it)
        yield StringCommand("rmdir", QuoteString(home))
    if exists:
        yield StringCommand("userdel", QuoteString(user))
    if exists or user in ask(host, Groups):
        yield StringCommand(
            "if getent group", QuoteString(user), ">/dev/null; then groupdel",
            QuoteString(user), "; fi",
        )  # fmt: skip
    if kind is None and not exists and user not in ask(host, Groups):
        host.noop(f"no {home} and no account {user}")


#: Kinds of :data:`p40fleet.footprint.UNDO_KINDS` whose items no operation undoes: kept on
#: purpose, or released by the run itself (the run lock).
NOT_OPERATIONS = ("kept", "released")


def undo(item: Item, spec: StackSpec) -> None:
    """Add the operation that undoes footprint ``item`` on the current host."""
    name = f"Uninstall: {item.what.format(**footprint.places(spec))}"
    path, among = item.path(spec), watched(spec)
    if item.undo == "ray_unit":
        ray_unit_removed(name=name)
    elif item.undo == "driver":
        runfile = posixpath.join(spec.paths.artifact_cache, spec.driver.filename)
        driver_removed(name=name, version=spec.driver.version, runfile=runfile, among=among)
    elif item.undo == "cuda_link":
        cuda_link_removed(name=name, cuda_link=path, cuda_dir=spec.paths.cuda_dir)
    elif item.undo == "nouveau":
        nouveau_restored(name=name, path=path)
    elif item.undo == "apt_mirror":
        apt_mirror_removed(name=name, among=among)
    elif item.undo == "apt_aside":
        apt_aside_restored(name=name)
    elif item.undo == "account":
        account_removed(name=name, account=path)
    elif item.undo == "remove":
        path_removed(name=name, path=path, among=among)
    elif item.undo == "home":
        if item.where == "{home}":  # one operation for the user and its home
            home_removed(
                name=name, user=spec.user.name, home=spec.user.home,
                policy=spec.policy.uninstall_home, among=among,
            )  # fmt: skip
    elif item.undo not in NOT_OPERATIONS:
        raise ValueError(f"footprint item {item.what!r}: no operation undoes {item.undo!r}")


#: Every kind :func:`undo` handles (tests/test_uninstall.py: the footprint's kinds are these).
HANDLED = (*ORDER,)
