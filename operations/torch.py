"""The torch trio in the training env, installed together from the spec's index."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version
from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from facts.python_env import EnvDistributions
from operations.training_user import as_user

__all__ = ["pip_command", "same_version", "torch"]


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
    index_args: list[str] | None = None,
    fresh_env: bool = False,
    force: bool = False,
    user: str | None = None,
):
    """
    Install ``torch==version`` (+ torchvision, torchaudio when pinned) into an env.

    + python: the env's interpreter
    + version: torch pin, e.g. ``2.6.0+cu118``
    + torchvision: torchvision pin, or None to leave it out (CPU-only labs)
    + torchaudio: torchaudio pin, or None to leave it out
    + index_args: pip arguments choosing the index (``spec.pip_index_args()``)
    + fresh_env: the env is (re)created earlier in this run: ignore what the fact saw
    + force: reinstall even when the pins are installed
    + user: run the commands as this user (``su``); None = as connected
    """
    pins = {"torch": version, "torchvision": torchvision, "torchaudio": torchaudio}
    pins = {name: pin for name, pin in pins.items() if pin}
    installed = {} if fresh_env else host.get_fact(EnvDistributions, python=python, user=user)
    wrong = {
        name: pin
        for name, pin in pins.items()
        if not same_version(installed.get(name).version if name in installed else None, pin)
    }
    if not wrong and not force:
        host.noop("torch already at the pin: " + ", ".join(f"{n}=={v}" for n, v in pins.items()))
        return
    for name, pin in wrong.items():
        if name in installed:
            host.log(f"{name} {installed[name].version} installed, the spec pins {pin}")
    # Install the whole trio together even if only one is off: they must match each other.
    yield as_user(
        user,
        pip_command(
            python,
            "install",
            *(["--force-reinstall"] if force else []),
            *(QuoteString(arg) for arg in index_args or []),
            *(QuoteString(f"{name}=={pin}") for name, pin in pins.items()),
        ),
    )
