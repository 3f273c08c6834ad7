"""The training user's PPO launch script, rendered from ``files/launch-ppo.sh.j2``.

The content comes from :func:`p40fleet.launch.plan_launch` (GPU facts + spec). It is written
by the training user (``operations.util.as_user.put_as``: root stages it outside the home);
an identical file (same sha1, mode, owner, as the user reads it) changes nothing.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.files import Directory
from pyinfra.facts.server import Users

from facts.home import UserFile
from facts.survey import Part, ask, part
from operations.refuse import refuse
from operations.util.as_user import put_as
from operations.util.unchanged import rendered, same_user_file
from p40fleet.launch import LaunchPlan
from p40fleet.spec import StackSpec

__all__ = ["SCRIPT_NAME", "TEMPLATE", "launch_script", "script_path", "survey_parts"]

SCRIPT_NAME = "launch-ppo.sh"
TEMPLATE = str(Path(__file__).resolve().parent.parent / "files" / "launch-ppo.sh.j2")


def script_path(home: str, name: str = SCRIPT_NAME) -> str:
    """``<home>/launch-ppo.sh``."""
    return posixpath.join(home, name)


@operation()
def launch_script(
    plan: LaunchPlan, user: str, home: str, name: str = SCRIPT_NAME, user_queued: bool = False
):
    """
    Write ``<home>/<name>`` (mode 755, owned by ``user``) running verl's PPO per ``plan``.

    + plan: the host's launch plan (``p40fleet.launch.plan_launch``)
    + user: the training user (owner and group of the script)
    + home: the training user's home, where the script goes
    + name: the script's file name
    + user_queued: an earlier operation of this run creates the user and home (deploy/full.py)

    Refuses the host (changes nothing) when the user or its home does not exist yet: the
    Python layer (deploy/python.py) creates both.
    """
    if not user_queued and user not in ask(host, Users):
        yield from refuse._inner(
            step="launch script",
            reason=f"training user {user} does not exist",
            remedy="run deploy/python.py first (it creates the training user)",
        )
        return
    if not user_queued and not ask(host, Directory, path=home):
        yield from refuse._inner(
            step="launch script",
            reason=f"home directory {home} of training user {user} does not exist",
            remedy="run deploy/python.py first (it creates the training user and its home)",
        )
        return
    values = plan.template_vars()
    dest = script_path(home, name)
    text = rendered(TEMPLATE, **values)
    if same_user_file(dest, text, user, "755"):
        return
    if ask(host, UserFile, path=dest, user=user).kind == "dir":
        yield from refuse._inner(
            step="launch script",
            reason=f"{dest} is a directory where the launch script goes",
            remedy=f"as {user}, move it away (mv {dest} {dest}.moved) and re-run",
        )
        return
    yield from put_as(user, text, dest, "755")


def survey_parts(spec: StackSpec) -> list[Part]:
    """What :func:`launch_script` asks on a converged host for the spec's training user
    (``operations.survey``)."""
    user = spec.user
    return [
        part(Users),  # a user not queued by this run
        part(Directory, path=user.home),
        part(UserFile, path=script_path(user.home), user=user.name),
    ]
