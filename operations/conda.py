"""Miniconda and the training env, run as the training user (``_su_user`` from the deploy).

Installer: ``bash Miniconda3-….sh -b -p PREFIX`` when there is no prefix, ``-b -u -p PREFIX``
when the prefix exists but ``bin/conda`` does not run. Since July 2025 a non-interactive
``conda create`` on Anaconda's default channels needs the ToS accepted for ``pkgs/main`` and
``pkgs/r``, or conda-forge (``--override-channels -c conda-forge``): spec.policy.conda_tos.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from facts.python_env import (
    ENV_OK,
    CondaInstall,
    EnvPython,
    MarkerText,
    env_dir,
)
from operations.training_user import as_user

__all__ = [
    "TOS_CHANNELS",
    "TOS_MARKER",
    "channel_args",
    "conda_tos",
    "env",
    "env_rebuild_reason",
    "miniconda",
]

#: Anaconda's default channels whose ToS a non-interactive ``conda create`` needs accepted.
TOS_CHANNELS: tuple[str, ...] = (
    "https://repo.anaconda.com/pkgs/main",
    "https://repo.anaconda.com/pkgs/r",
)
#: Written in the prefix after ``conda tos accept`` succeeded: one channel URL per line.
TOS_MARKER = ".p40fleet-conda-tos"


def _conda(prefix: str) -> str:
    return f"{prefix.rstrip('/')}/bin/conda"


def channel_args(conda_tos: str) -> list[str]:
    """Extra ``conda create`` arguments for the ToS policy (``accept`` needs none)."""
    return ["--override-channels", "-c", "conda-forge"] if conda_tos == "conda-forge" else []


@operation()
def miniconda(installer: str, prefix: str, force: bool = False, user: str | None = None):
    """
    Install Miniconda from a verified installer when ``PREFIX/bin/conda`` is missing or broken.

    + installer: path of the (sha256-verified) installer on the host
    + prefix: install prefix
    + force: reinstall in place (``-u``) even when conda runs
    + user: run the commands as this user (``su``); None = as connected
    """
    state = host.get_fact(CondaInstall, prefix=prefix)
    if state.healthy and not force:
        host.noop(f"conda {state.version or ''} at {prefix} runs".replace("  ", " "))
        return
    args: list[str | QuoteString] = ["bash", QuoteString(installer), "-b"]
    if state.state != "missing":
        # The prefix exists (broken, or forced): update in place, keep the envs.
        host.log(f"conda at {prefix} is {state.state}: reinstalling in place (-u)")
        args.append("-u")
    args += ["-p", QuoteString(prefix)]
    yield as_user(user, StringCommand(*args))


@operation()
def conda_tos(prefix: str, policy: str = "accept", user: str | None = None):
    """
    Accept Anaconda's ToS for the default channels once (policy ``accept``).

    + prefix: Miniconda prefix
    + policy: ``accept`` or ``conda-forge`` (nothing to accept: creates use conda-forge)
    + user: run the commands as this user (``su``); None = as connected
    """
    if policy != "accept":
        host.noop(f"conda ToS policy {policy}: env is created from conda-forge")
        return
    conda_ok = host.get_fact(CondaInstall, prefix=prefix).healthy
    marker = f"{prefix.rstrip('/')}/{TOS_MARKER}"
    recorded = set((host.get_fact(MarkerText, path=marker) or "").split())
    # A (re)install in this run may have reset conda's ToS state: accept again then.
    missing = [c for c in TOS_CHANNELS if c not in recorded or not conda_ok]
    if not missing:
        host.noop("Anaconda ToS already accepted for pkgs/main and pkgs/r")
        return
    for channel in missing:
        yield as_user(
            user,
            StringCommand(
                QuoteString(_conda(prefix)),
                "tos accept --override-channels --channel",
                QuoteString(channel),
            ),
        )
    yield as_user(
        user,
        StringCommand(
            "printf '%s\\n'", *(QuoteString(c) for c in TOS_CHANNELS), ">", QuoteString(marker)
        ),
    )


def env_rebuild_reason(prefix: str, name: str, python_version: str) -> str | None:
    """Why the env must be (re)created, from the ``EnvPython`` fact; ``None`` when healthy.

    Later steps (torch, apex, verl) call this too: an env recreated in this run is empty, so
    their "already installed" facts gathered before it no longer hold.
    """
    state = host.get_fact(EnvPython, prefix=prefix, env_name=name)
    if state.state == "missing":
        return f"env {name} does not exist"
    if state.state != ENV_OK:
        return f"env {name} is broken: its python does not run ({state.detail})"
    if state.version != python_version:
        return f"env {name} has python {state.version}, the spec pins {python_version}"
    return None


@operation()
def env(
    prefix: str,
    env_name: str,
    python_version: str,
    channels: list[str] | None = None,
    force: bool = False,
    user: str | None = None,
):
    """
    Create conda env ``name`` with ``python=python_version``; keep it while healthy.

    + prefix: Miniconda prefix
    + env_name: env name
    + python_version: exact X.Y.Z the env's python must report
    + channels: extra create arguments, e.g. ``["--override-channels", "-c", "conda-forge"]``
    + force: remove and recreate even a healthy env
    + user: run the commands as this user (``su``); None = as connected

    A missing or non-running python, or the wrong version, means remove + create (the reason is
    logged); a healthy env at the pinned version is kept.
    """
    name = env_name
    reason = env_rebuild_reason(prefix, name, python_version)
    if reason is None and not force:
        host.noop(f"env {name} is healthy (python {python_version})")
        return
    state = host.get_fact(EnvPython, prefix=prefix, env_name=name)
    conda = QuoteString(_conda(prefix))
    if state.state != "missing":
        host.log(f"recreating env {name}: {reason or 'forced by policy.force_reinstall'}")
        yield as_user(user, StringCommand(conda, "env remove -n", QuoteString(name), "-y"))
        # conda leaves files it did not install (pip caches, markers): start clean.
        yield as_user(user, StringCommand("rm -rf", QuoteString(env_dir(prefix, name))))
    yield as_user(
        user,
        StringCommand(
            conda,
            "create -n",
            QuoteString(name),
            QuoteString(f"python={python_version}"),
            "-y",
            *(QuoteString(arg) for arg in channels or []),
        ),
    )
