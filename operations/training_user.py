"""The training user: fixed name and uid, bash, home kept across an OS reinstall.

The uid is pinned (spec.user.uid) so that after an OS reinstall that keeps ``/home`` the user is
recreated with the same uid and owns its old files again. An existing home directory is reused
as is (``useradd -M``): never recreated from the skeleton, never wiped.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import Directory
from pyinfra.facts.server import Groups, Users
from pyinfra.operations import files, server

from facts.survey import ask
from operations.refuse import refuse
from operations.survey import same_dir

__all__ = ["HOME_MODE", "SYSTEM_UID_MAX", "as_user", "mkdir_as", "training_user"]

#: The home's mode: the training data, models and checkpoints in it are not world-readable.
HOME_MODE = "750"
#: uids below 1000 are system accounts (Debian/Ubuntu's UID_MIN): never re-numbered for us.
SYSTEM_UID_MAX = 999


@operation()
def training_user(user: str, uid: int, home: str, shell: str = "/bin/bash"):
    """
    Ensure group ``user`` (gid = ``uid``) and user ``user`` with ``uid``, ``home``, ``shell``.

    + user: user (and primary group) name
    + uid: fixed uid, also used as the gid of a newly created group
    + home: home directory; an existing one is reused, a missing one created from /etc/skel
    + shell: login shell

    Refuses the host (changes nothing) when the user exists with another uid, or the uid belongs
    to another user: fixing either means re-owning files, which is the admin's decision. A system
    account (uid < 1000) is never suggested for re-numbering. The home is kept at mode 0750.
    """
    name = user
    users = ask(host, Users)
    existing = users.get(name)
    if existing is not None and existing["uid"] != uid and existing["uid"] <= SYSTEM_UID_MAX:
        yield from refuse._inner(
            step="training user",
            reason=f"user {name} is a system account (uid {existing['uid']}): it cannot be the "
            "training user",
            remedy="pick another stack.user.name (a user of its own, e.g. verl)",
        )
        return
    if existing is not None and existing["uid"] != uid:
        yield from refuse._inner(
            step="training user",
            reason=f"user {name} exists with uid {existing['uid']}, the spec pins uid {uid}",
            remedy=f"set stack.user.uid = {existing['uid']} or change the user's uid by hand "
            f"(usermod -u {uid} {name} and re-own its files)",
        )
        return
    holder = next((u for u, info in users.items() if info["uid"] == uid and u != name), None)
    if holder is not None:
        yield from refuse._inner(
            step="training user",
            reason=f"uid {uid} already belongs to user {holder}",
            remedy="choose a free uid in stack.user.uid",
        )
        return

    groups = ask(host, Groups)
    home_exists = bool(ask(host, Directory, path=home))
    if (
        existing is not None
        and name in groups
        and existing.get("group") == name
        and (existing.get("home"), existing.get("shell")) == (home, shell)
        and home_exists
        and same_dir(home, name, name, HOME_MODE)
    ):
        return  # what server.user and files.directory would leave unchanged, from the survey

    if name not in groups:
        yield from server.group._inner(group=name, gid=uid)

    if existing is None and home_exists:
        host.log(f"reusing the existing home {home} for new user {name} (uid {uid})")
    yield from server.user._inner(
        user=name,
        uid=uid,
        group=name,
        home=home,
        shell=shell,
        # -m only when there is no home yet: a kept /home after a reinstall is reused as is.
        create_home=not home_exists,
        ensure_home=True,
    )
    # S20: useradd's default mode may let every local account read the data and checkpoints
    yield from files.directory._inner(path=home, user=name, group=name, mode=HOME_MODE)


@operation()
def directory(path: str, user: str, group: str, mode: str):
    """
    ``files.directory`` for a directory of the training user; nothing asked again when the
    survey already shows it right (``operations.survey.same_dir``).
    """
    if not same_dir(path, user, group, mode):
        yield from files.directory._inner(path=path, user=user, group=group, mode=mode)


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


def queued_hosts(state) -> set[str]:
    """Hosts whose training user is created by an operation of this run (later deploys of the
    same run, e.g. deploy/training.py, may rely on the user before it exists)."""
    queued = getattr(state, "p40fleet_training_user_queued", None)
    if queued is None:
        queued = set()
        state.p40fleet_training_user_queued = queued
    return queued
