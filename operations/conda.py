"""Miniconda and the training env, run as the training user (``_su_user`` from the deploy).

Installer: ``bash Miniconda3-….sh -b -p PREFIX`` when there is no prefix, ``-b -u -p PREFIX``
when the prefix exists but ``bin/conda`` does not run.

Anaconda's Terms of Service: a conda with the ``conda-anaconda-tos`` plugin (bundled from
Miniconda 25.5.1) refuses a non-interactive ``conda create`` on the default channels until the
ToS of ``pkgs/main`` and ``pkgs/r`` is accepted; the pinned py310_24.11.1-0 has no plugin, no
``conda tos`` subcommand and no check. spec.policy.conda_tos: ``conda-forge`` (the default:
``--override-channels -c conda-forge``, no ToS, no licence limit) or ``accept`` (the default
channels; accepted only where the installed conda has the plugin: the ``CondaTos`` fact).

The env comes from an explicit lock (``files/conda-env-<variant>.txt``, p40fleet/condalock.py):
``conda create -n NAME --file LOCK`` installs exactly its files and checks each one's sha256.

A mirror channel (``stack.mirror.conda_channel``) replaces both: the lock's URLs move onto it,
``conda create --override-channels -c URL``, and ``condarc`` writes ``PREFIX/.condarc`` naming
only that channel (so a later hand-run ``conda install`` does not reach for the internet
either); no ToS applies.
"""

from __future__ import annotations

import posixpath
from io import StringIO

from pyinfra import host
from pyinfra.api import Host, QuoteString, StringCommand, operation
from pyinfra.operations import files

from p40fleet import condalock
from p40fleet.facts.conda import TOS_NO_CONDA, TOS_NO_PLUGIN, TOS_PLUGIN, CondaInstall, CondaTos
from p40fleet.facts.env import ENV_OK, EnvPython, MarkerText, env_dir
from p40fleet.facts.survey import Part, ask, part
from p40fleet.operations.refuse import refuse
from p40fleet.operations.util.as_user import as_user, replace_text, write_as
from p40fleet.proxy import proxied
from p40fleet.spec import Proxy, StackSpec

__all__ = [
    "LOCK_MARKER",
    "TOS_CHANNELS",
    "TOS_MARKER",
    "channel_args",
    "conda_tos",
    "condarc",
    "condarc_text",
    "env",
    "env_fresh",
    "env_lock",
    "env_rebuild_reason",
    "miniconda",
    "survey_parts",
]

#: Anaconda's default channels whose ToS a non-interactive ``conda create`` needs accepted.
TOS_CHANNELS: tuple[str, ...] = (
    "https://repo.anaconda.com/pkgs/main",
    "https://repo.anaconda.com/pkgs/r",
)
#: Written in the prefix after ``conda tos accept`` succeeded: one channel URL per line.
TOS_MARKER = ".p40fleet-conda-tos"
#: Written in the env after ``conda create --file LOCK``: the rendered lock's sha256.
LOCK_MARKER = ".p40fleet-conda-lock"


def _conda(prefix: str) -> str:
    return f"{prefix.rstrip('/')}/bin/conda"


def channel_args(conda_tos: str, mirror_channel: str | None = None) -> list[str]:
    """Extra ``conda create`` arguments: the mirror channel only when set, else per the ToS
    policy (``accept`` needs none)."""
    if mirror_channel:
        return ["--override-channels", "-c", mirror_channel]
    return ["--override-channels", "-c", "conda-forge"] if conda_tos == "conda-forge" else []


def condarc_text(channel: str) -> str:
    """``PREFIX/.condarc`` naming the mirror channel as the only one (``defaults`` too)."""
    return (
        "# p40fleet: stack.mirror.conda_channel (written by deploy/python.py; edits are replaced)\n"
        f"channels:\n  - {channel}\ndefault_channels:\n  - {channel}\n"
    )


@operation()
def condarc(prefix: str, channel: str, user: str | None = None):
    """
    Write ``PREFIX/.condarc`` so that conda's channels are the mirror's only.

    + prefix: Miniconda prefix (its root ``.condarc`` applies to every env of it)
    + channel: the mirror channel URL
    + user: run the commands as this user (``su``); None = as connected
    """
    path = f"{prefix.rstrip('/')}/.condarc"
    text = condarc_text(channel)
    if (ask(host, MarkerText, path=path, user=user) or "") == text.strip():
        host.noop(f"{path} names only {channel}")
        return
    yield write_as(user, path, *text.splitlines())


@operation()
def miniconda(installer: str, prefix: str, force: bool = False, user: str | None = None):
    """
    Install Miniconda from a verified installer when ``PREFIX/bin/conda`` is missing or broken.

    + installer: path of the (sha256-verified) installer on the host
    + prefix: install prefix
    + force: reinstall in place (``-u``) even when conda runs
    + user: run the commands as this user (``su``); None = as connected
    """
    state = ask(host, CondaInstall, prefix=prefix, user=user)
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
def conda_tos(
    prefix: str,
    policy: str = "conda-forge",
    user: str | None = None,
    mirror_channel: str | None = None,
    proxy: Proxy | None = None,
):
    """
    Accept Anaconda's ToS for the default channels once, where the installed conda checks it.

    + prefix: Miniconda prefix
    + policy: ``accept`` or ``conda-forge`` (nothing to accept: creates use conda-forge)
    + user: run the commands as this user (``su``); None = as connected
    + proxy: ``stack.proxy`` for the fetch (None: no proxy)
    + mirror_channel: creates use this channel only: nothing to accept (``conda tos accept``
      would fetch the terms from repo.anaconda.com)

    Decided from the installed conda (``conda tos --help``): without the plugin there is nothing
    to accept and ``conda tos`` would fail (``invalid choice: 'tos'``), so nothing runs. Before
    conda is installed (the installer runs earlier in this deploy) the same test runs on the
    host, just before accepting.
    """
    if mirror_channel:
        host.noop(f"env is created from the mirror channel {mirror_channel}: no ToS to accept")
        return
    if policy != "accept":
        host.noop(f"conda ToS policy {policy}: env is created from conda-forge")
        return
    conda = _conda(prefix)
    installed = ask(host, CondaInstall, prefix=prefix, user=user)
    tos = ask(host, CondaTos, prefix=prefix, user=user)
    marker = f"{prefix.rstrip('/')}/{TOS_MARKER}"
    accept = [
        StringCommand(
            QuoteString(conda), "tos accept --override-channels --channel", QuoteString(channel)
        )
        for channel in TOS_CHANNELS
    ]
    record = replace_text(marker, *TOS_CHANNELS)
    if not installed.healthy or tos.state == TOS_NO_CONDA:
        # Not installed (or broken) yet: the installer runs earlier in this deploy, so decide
        # on the host; a (re)install may also have reset conda's ToS state.
        host.log(f"conda at {prefix} is {installed.state}: ToS accepted if it has the plugin")
        steps: list[StringCommand | str] = []
        for command in [*accept, record]:
            steps += [command, "&&"]
        yield proxied(
            as_user(
                user,
                StringCommand(
                    "if", QuoteString(conda), "tos --help >/dev/null 2>&1; then", *steps[:-1],
                    "; fi",
                ),
            ),
            proxy,
        )  # fmt: skip
        return
    if tos.state == TOS_NO_PLUGIN:
        host.noop(
            f"conda {installed.version or ''} at {prefix} has no ToS plugin "
            "(conda-anaconda-tos): the default channels need no acceptance".replace("  ", " ")
        )
        return
    if tos.state != TOS_PLUGIN:
        # conda runs but `conda tos --help` failed oddly: accepting shows conda's own error
        host.log(f"conda at {prefix}: {tos.detail}")
    else:
        recorded = set((ask(host, MarkerText, path=marker, user=user) or "").split())
        if all(c in recorded for c in TOS_CHANNELS):
            host.noop("Anaconda ToS already accepted for pkgs/main and pkgs/r")
            return
    for command in [*accept, record]:
        yield proxied(as_user(user, command), proxy)


def env_rebuild_reason(
    prefix: str,
    name: str,
    python_version: str,
    user: str | None,
    target: Host | None = None,
    lock_sum: str | None = None,
) -> str | None:
    """Why the env must be (re)created, from the ``EnvPython`` fact and the lock the env records
    it was made from (``LOCK_MARKER``); ``None`` when healthy and made from ``lock_sum``.

    Later steps (torch, apex, verl) call this too (:func:`env_fresh`): an env recreated in this
    run is empty, so their "already installed" facts gathered before it no longer hold.
    ``target``: another inventory host (the Apex builder election); default this host.
    ``lock_sum``: :func:`p40fleet.condalock.digest` of the rendered lock (None: not compared).
    """
    where = host if target is None else target
    state = ask(where, EnvPython, prefix=prefix, env_name=name, user=user)
    if state.state == "missing":
        return f"env {name} does not exist"
    if state.state != ENV_OK:
        return f"env {name} is broken: its python does not run ({state.detail})"
    if state.version != python_version:
        return f"env {name} has python {state.version}, the spec pins {python_version}"
    if lock_sum is not None:
        marker = f"{env_dir(prefix, name)}/{LOCK_MARKER}"
        recorded = ask(where, MarkerText, path=marker, user=user)
        if not recorded:
            return (
                f"env {name} records no conda lock (made by version only, before the lock, or "
                "by hand): its packages were never checked against a sum"
            )
        if recorded != lock_sum:
            return (
                f"env {name} was made from another conda lock (sha256 {recorded[:12]}…, the "
                f"lock is now {lock_sum[:12]}…)"
            )
    return None


def env_fresh(
    prefix: str,
    name: str,
    python_version: str,
    user: str | None,
    force: bool = False,
    target: Host | None = None,
    lock_sum: str | None = None,
) -> bool:
    """The env is (re)created by this run (:func:`env` with these arguments): the installed-
    package facts gathered before it no longer hold. ``target``, ``lock_sum``: as
    :func:`env_rebuild_reason`."""
    reason = env_rebuild_reason(prefix, name, python_version, user, target, lock_sum)
    return reason is not None or force


def env_lock(lock: str, python_version: str, channel: str | None) -> tuple[str, list[str]]:
    """The lock ``conda create --file`` gets and what stops it (``condalock.load``)."""
    return condalock.load(lock, python_version, channel)


@operation()
def env(
    prefix: str,
    env_name: str,
    python_version: str,
    lock: str | None = None,
    lock_dest: str | None = None,
    lock_channel: str | None = None,
    channels: list[str] | None = None,
    force: bool = False,
    user: str | None = None,
    proxy: Proxy | None = None,
):
    """
    Create conda env ``name`` from an explicit lock; keep it while healthy and made from it.

    + prefix: Miniconda prefix
    + env_name: env name
    + python_version: exact X.Y.Z the env's python must report (the lock's python)
    + lock: local explicit lock (``files/conda-env-<variant>.txt``: URL#sha256 per package)
    + lock_dest: where the rendered lock is uploaded (root-owned, outside the user's home)
    + lock_channel: the channel the lock's URLs are moved onto (the mirror's); None: its own
    + channels: extra create arguments, e.g. ``["--override-channels", "-c", "conda-forge"]``
    + force: remove and recreate even a healthy env
    + user: run the commands as this user (``su``); None = as connected
    + proxy: ``stack.proxy`` for the fetch (None: no proxy)

    ``conda create --file LOCK`` installs exactly the lock's files, each checked against its
    sum (conda fails naming a file that does not match). A missing or non-running python, the
    wrong version, or an env not recorded as made from this lock (``LOCK_MARKER``) means
    remove + create (the reason is logged); a healthy env made from the lock is kept.
    """
    name = env_name
    if lock is None or lock_dest is None:
        raise ValueError("conda.env: lock and lock_dest are required (every file is hashed)")
    text, problems = env_lock(lock, python_version, lock_channel)
    if problems:
        yield from refuse._inner(
            step="conda env",
            reason=f"{lock}: " + "; ".join(problems),
            remedy="regenerate the lock on a trusted machine that reaches the channel: conda "
            f"create -n lock python={python_version} -y && conda list -n lock --explicit "
            f"--sha256 > {posixpath.basename(lock)} (--md5 for a conda older than 24.9; see its "
            "header)",
        )
        return
    digest = condalock.digest(text)
    reason = env_rebuild_reason(prefix, name, python_version, user, lock_sum=digest)
    if reason is None and not force:
        host.noop(f"env {name} is healthy (python {python_version}, from the conda lock)")
        return
    state = ask(host, EnvPython, prefix=prefix, env_name=name, user=user)
    conda = QuoteString(_conda(prefix))
    if state.state != "missing":
        host.log(f"recreating env {name}: {reason or 'forced by policy.force_reinstall'}")
        yield as_user(user, StringCommand(conda, "env remove -n", QuoteString(name), "-y"))
        # conda leaves files it did not install (pip caches, markers): start clean.
        yield as_user(user, StringCommand("rm -rf", QuoteString(env_dir(prefix, name))))
    # Root writes the lock outside the home (the artifact cache); the user's conda reads it.
    yield from files.put._inner(src=StringIO(text), dest=lock_dest, add_deploy_dir=False)
    yield proxied(as_user(
        user,
        StringCommand(
            conda,
            "create -n",
            QuoteString(name),
            "--file",
            QuoteString(lock_dest),
            "-y",
            *(QuoteString(arg) for arg in channels or []),
        ),
    ), proxy)  # fmt: skip
    marker = f"{env_dir(prefix, name)}/{LOCK_MARKER}"
    yield write_as(user, marker, digest)


def survey_parts(spec: StackSpec) -> list[Part]:
    """The facts this module asks on a converged host (its operations and :func:`env_fresh`,
    as the training user: ``operations.run.survey``)."""
    env, by_user = spec.env, {"user": spec.user.name}
    prefix = env.conda_prefix
    return [
        part(CondaInstall, prefix=prefix, **by_user),  # miniconda, conda_tos
        part(CondaTos, prefix=prefix, **by_user),
        part(MarkerText, path=f"{prefix.rstrip('/')}/.condarc", **by_user),  # condarc
        part(MarkerText, path=f"{prefix.rstrip('/')}/{TOS_MARKER}", **by_user),
        part(EnvPython, prefix=prefix, env_name=env.name, **by_user),  # env, env_fresh
        part(MarkerText, path=f"{env_dir(prefix, env.name)}/{LOCK_MARKER}", **by_user),
    ]
