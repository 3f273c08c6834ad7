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

from p40fleet.facts.survey import Part, ask, part
from p40fleet.operations.refuse import refuse
from p40fleet.operations.util.as_user import as_user
from p40fleet.operations.util.unchanged import same_dir
from p40fleet.run_record import run_record
from p40fleet.spec import StackSpec

__all__ = [
    "HOME_MODE",
    "SYSTEM_UID_MAX",
    "home_owner_problem",
    "training_user",
    "survey_parts",
]

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
    home_info = ask(host, Directory, path=home)
    home_exists = bool(home_info)
    if home_info is False:
        yield from refuse._inner(
            step="training user",
            reason=f"{home} exists and is not a directory (a file or a symlink)",
            remedy=f"move {home} away, or set stack.user.home to the user's own directory",
        )
        return
    if home_info and (problem := home_owner_problem(home, home_info, name, uid)):
        yield from refuse._inner(
            step="training user",
            reason=problem,
            remedy=f"set stack.user.home to a directory of {name}'s own (e.g. /home/{name}), "
            f"or, if {home} really is {name}'s, chown {uid}:{uid} {home} by hand",
        )
        return
    if (
        existing is not None
        and name in groups
        and existing.get("group") == name
        and (existing.get("home"), existing.get("shell")) == (home, shell)
        and home_exists
        and same_dir(home, name, name, HOME_MODE)
    ):
        return  # what server.user and files.directory would leave unchanged, from the survey

    # S3 at run time too: a home that another uid came to own since the facts were read
    yield StringCommand(
        "if [ -e", QuoteString(home), '] && o=$(stat -c %u', QuoteString(home),
        ') && [ "$o" !=', QuoteString(str(uid)), "]; then echo",
        QuoteString(f"training user: {home} belongs to uid"), '"$o ($(stat -c %U',
        QuoteString(home), '))",',
        QuoteString(f"not to {name} (uid {uid}): refusing to take it over; fix: set "
                    f"stack.user.home to a directory of {name}'s own"),
        ">&2; exit 1; fi",
    )  # fmt: skip
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


def home_owner_problem(home: str, info: dict, name: str, uid: int) -> str | None:
    """Why an existing ``home`` (its ``Directory`` fact) is not the training user's to take:
    it belongs to another user (S3). ``None`` when it is ``name``'s or ``uid``'s."""
    owner = str(info.get("user"))
    # GNU stat's %U is "UNKNOWN" for a uid without a passwd entry (a kept /home after an OS
    # reinstall): the numeric check run just before useradd decides that case.
    if owner in (name, str(uid), "UNKNOWN"):
        return None
    return (
        f"{home} exists and belongs to {owner}, not to {name} (uid {uid}): another "
        "account's home is never taken over"
    )


@operation()
def directory(path: str, user: str, group: str, mode: str):
    """
    A directory of the training user, made and fixed BY that user (``mkdir -p``, ``chgrp``,
    ``chmod`` as ``user``: root never follows a link the user put there, N3); nothing asked
    again when the survey already shows it right (``operations.util.unchanged.same_dir``).

    Refuses the host when ``path`` is not a directory (a symlink, a file: N6) or belongs to
    another user (the training user cannot fix that, and root does not act there).
    """
    if same_dir(path, user, group, mode):
        return
    info = ask(host, Directory, path=path)
    if info is False:
        yield from refuse._inner(
            step=f"directory {path}",
            reason=f"{path} exists and is not a directory (a symlink or a file)",
            remedy=f"as {user}, move it away (mv {path} {path}.moved) and re-run",
        )
        return
    if info and str(info.get("user")) != user:
        yield from refuse._inner(
            step=f"directory {path}",
            reason=f"{path} belongs to {info.get('user')}, not to the training user {user}",
            remedy=f"chown {user}:{group} {path} by hand (or move it away) and re-run",
        )
        return
    q = QuoteString(path)
    yield as_user(
        user,
        StringCommand(
            "mkdir -p", q, "&& chgrp", QuoteString(group), q, "&& chmod", QuoteString(mode), q
        ),
    )


def queued_hosts(state) -> set[str]:
    """Hosts whose training user is created by an operation of this run (later deploys of the
    same run, e.g. deploy/training.py, may rely on the user before it exists)."""
    return run_record(state).training_user_queued


def survey_parts(spec: StackSpec) -> list[Part]:
    """The facts this module's operations ask on a converged host, for the user and the
    dirs deploy/python.py makes (``operations.run.survey``)."""
    user, env = spec.user, spec.env
    return [
        part(Users),  # training_user
        part(Groups),
        part(Directory, path=user.home),
        part(Directory, path=env.data_dir),  # directory
        part(Directory, path=env.model_dir),
    ]
