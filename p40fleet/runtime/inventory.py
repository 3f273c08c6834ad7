"""An inventory read as pyinfra's command line reads it: the same hosts, the same data.

Adapts pyinfra's CLI: ``pyinfra_cli.inventory.make_inventory`` is the command line's own
loader (an inventory file's groups, ``group_data/`` beside it, a bare host name), not part of
``pyinfra.api``. ``python -m p40fleet.deploy`` (the inventory checks, exit 2),
``python -m p40fleet.rekey`` (a host's address and known_hosts) and ``python -m
p40fleet.mirror build --inventory`` (the hosts' specs) need exactly the hosts and data the
pyinfra run will have, so they read it here, in one place, with the contexts pyinfra's CLI
sets (``ctx_config``, ``ctx_state``: an inventory file may read them) and from the directory
the CLIs run pyinfra in.

The supported alternative, ``pyinfra INVENTORY debug-inventory --json`` in a subprocess, is
not taken: it returns the data through JSON (a tuple becomes a list, an object that JSON cannot
write fails the read) and costs a second interpreter start before the run's own.

Checked against pyinfra 3.10.0 (``pyinfra_cli/inventory.py`` ``make_inventory(inventory,
cwd=..., override_data=None, group_data_directories=None)``, ``pyinfra_cli/cli.py`` setting
``ctx_config``/``ctx_state`` before it).
"""

from __future__ import annotations

import os
from pathlib import Path

from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_config, ctx_state

__all__ = ["load_inventory"]


def load_inventory(source: str, cwd: Path) -> Inventory:
    """pyinfra's inventory of ``source`` (a file, or a host name as the CLI takes one), read
    from ``cwd`` (group data and relative paths), with fresh CLI contexts; the working
    directory is restored. pyinfra's own exceptions pass through."""
    before = os.getcwd()
    try:
        os.chdir(cwd)
        from pyinfra_cli.inventory import make_inventory  # the CLI only where it is needed

        with ctx_config.use(Config()), ctx_state.use(State()):  # as pyinfra's CLI sets them
            return make_inventory(source, cwd=str(cwd))
    finally:
        os.chdir(before)
