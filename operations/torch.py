"""torch (+ torchvision/torchaudio when the spec pins them) in the training env, installed with
its whole dependency closure from a hash-locked file (``files/torch-requirements-<variant>.txt``,
the spec's selection of it: ``p40fleet.hashlock.render``) with ``--require-hashes``. The lock
also carries ``ninja`` for the Apex build that follows (``operations/apex.py``).

A lock that cannot install the pins is refused here too, but deploy/preflight.py refuses such a
host first (``p40fleet.preflight.torch_refusal``, the same ``render``), before any change."""

from __future__ import annotations

from io import StringIO

from packaging.version import InvalidVersion, Version
from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.operations import files

from p40fleet import hashlock
from p40fleet.facts.env import EnvDistributions, env_python
from p40fleet.facts.survey import Part, ask, part
from p40fleet.operations.refuse import refuse
from p40fleet.operations.util.as_user import as_user
from p40fleet.proxy import proxied
from p40fleet.spec import Proxy, StackSpec

__all__ = ["BUILD_TOOLS", "pip_command", "same_version", "torch", "survey_parts"]

#: Lock lines a later step runs from the env (the Apex build's ``ninja``), checked like the pins:
#: an env made before the lock carried them, torch at the pin, still gets them from the lock.
BUILD_TOOLS = ("ninja",)


def same_version(installed: str | None, pinned: str) -> bool:
    """PEP 440 equality (``2.6.0+cu118`` == ``2.6.0+CU118``); False when not installed."""
    if installed is None:
        return False
    try:
        return Version(installed) == Version(pinned)
    except InvalidVersion:
        return installed == pinned


def pip_command(python: str, *args: str | QuoteString | StringCommand) -> StringCommand:
    """``PYTHON -m pip --disable-pip-version-check ARGS`` (the env's own pip)."""
    return StringCommand(QuoteString(python), "-m pip --disable-pip-version-check", *args)


@operation()
def torch(
    python: str,
    version: str,
    torchvision: str | None = None,
    torchaudio: str | None = None,
    lock: str | None = None,
    lock_dest: str | None = None,
    sha256: dict[str, str] | None = None,
    index_args: list[str] | None = None,
    fresh_env: bool = False,
    force: bool = False,
    user: str | None = None,
    proxy: Proxy | None = None,
):
    """
    Install ``torch==version`` (+ torchvision, torchaudio when pinned) into an env.

    The lock's :data:`BUILD_TOOLS` lines (``ninja``) count like the pins: an env at the pins
    without them gets the lock installed (pip adds only what is missing).

    + python: the env's interpreter
    + version: torch pin, e.g. ``2.6.0+cu118``
    + torchvision: torchvision pin, or None to leave it out (CPU-only labs)
    + torchaudio: torchaudio pin, or None to leave it out
    + lock: local hash-locked requirements holding torch, its closure and the opt-in lines
    + lock_dest: where the selection for the pins (with ``sha256`` added) is uploaded
    + sha256: ``{distribution: sum}`` the spec supplies for lock lines without a sum
    + index_args: pip arguments choosing the index (``spec.pip_index_args()``)
    + fresh_env: the env is (re)created earlier in this run: ignore what the fact saw
    + force: reinstall even when the pins are installed
    + user: run the commands as this user (``su``); None = as connected
    + proxy: ``stack.proxy`` for the fetch (None: no proxy)
    """
    pins = {"torch": version, "torchvision": torchvision, "torchaudio": torchaudio}
    pins = {name: pin for name, pin in pins.items() if pin}
    locked, unreadable = "", None
    if lock is not None:
        try:
            with open(lock) as handle:
                locked = handle.read()
        except OSError as exc:  # e.g. stack.verl.requirements names a variant without a lock
            unreadable = exc.strerror
    tools = {
        name: pin for name, pin in hashlock.pinned(locked).items() if name in BUILD_TOOLS and pin
    }
    installed = {} if fresh_env else ask(host, EnvDistributions, python=python, user=user)
    wrong = {
        name: pin
        for name, pin in (pins | tools).items()
        if not same_version(installed.get(name).version if name in installed else None, pin)
    }
    if not wrong and not force:
        host.noop("torch already at the pin: " + ", ".join(f"{n}=={v}" for n, v in pins.items()))
        return
    for name, pin in wrong.items():
        whose = "the lock" if name in tools else "the spec"
        if name in installed:
            host.log(f"{name} {installed[name].version} installed, {whose} pins {pin}")
        elif name in tools and installed:
            host.log(f"{name} not in the env, the lock pins {pin} (the Apex build runs it)")
    if lock is None or lock_dest is None:
        raise ValueError("torch: lock and lock_dest are required (every byte installed is hashed)")
    if unreadable is None:
        # the spec's selection (opt-in lines of packages not pinned dropped), sums added:
        # the uploaded file holds exactly what is installed; the preflight decides alike
        text, problems = hashlock.render(locked, pins, sha256 or {})
    else:
        text, problems = "", [f"cannot read it ({unreadable})"]
    if problems:
        yield from refuse._inner(
            step="torch install",
            reason=f"{lock}: " + "; ".join(problems),
            remedy="put the sha256 of each named wheel (as its index publishes it) in "
            "stack.torch.sha256, or regenerate the lock for the spec's torch pins (see the file's "
            "header)",
        )
        return
    yield from files.put._inner(src=StringIO(text), dest=lock_dest, add_deploy_dir=False)
    # The whole closure at once: --require-hashes refuses any file whose sum the lock does not
    # list and any dependency the lock does not pin, so nothing reaches the env unhashed.
    yield proxied(as_user(
        user,
        pip_command(
            python,
            "install --require-hashes",
            *(["--force-reinstall"] if force else []),
            *(QuoteString(arg) for arg in index_args or []),
            "-r",
            QuoteString(lock_dest),
        ),
    ), proxy)  # fmt: skip


def survey_parts(spec: StackSpec) -> list[Part]:
    """What :func:`torch` asks on a converged host (``operations.run.survey``)."""
    python = env_python(spec.env.conda_prefix, spec.env.name)
    return [part(EnvDistributions, python=python, user=spec.user.name)]
