"""Shared by the Python-layer component tests (test_conda, test_torch, test_verl): the training
env's paths and a shell runner for the facts' commands."""

from __future__ import annotations

import getpass
import subprocess

PREFIX = "/home/verl/miniconda3"
PY = f"{PREFIX}/envs/verl-p40/bin/python"
ENV = f"{PREFIX}/envs/verl-p40"

#: The tests' own user: the facts' privilege drop runs without runuser then.
ME = getpass.getuser()


def sh(command) -> tuple[int, list[str]]:
    """Run a fact's command (a string or a pyinfra StringCommand) here; its rc and stdout lines."""
    text = command if isinstance(command, str) else command.get_raw_value()
    proc = subprocess.run(["sh", "-c", text], capture_output=True, text=True)
    return proc.returncode, proc.stdout.splitlines()
