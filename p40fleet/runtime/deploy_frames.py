"""Give each deploy file a module entry, so pyinfra's per-operation stack walk stays cheap.

pyinfra's CLI orders operations by the call stack: every operation call, on every host, runs
``inspect.stack()`` and then ``getframeinfo`` on each frame again. For a frame whose file no
module claims — a deploy file, which pyinfra ``exec``s — ``inspect.getmodule`` finds nothing in
its cache and scans all of ``sys.modules`` (some 850 modules on the controller), three times
per frame. With ``deploy/full.py`` including a layer that is two such frames: 2.3 ms of
controller CPU per operation, measured in a deploy on the lab, about 0.1 s per host of a
no-op run. An entry in ``sys.modules`` whose ``__file__`` is the deploy file lets inspect answer
from its cache: 0.4 ms. The entries are bare modules: nothing imports them and the deploy
files still run only as pyinfra runs them.

Adapts inspect (through ``sys.modules``, which ``inspect.getmodule`` scans); no pyinfra code is
touched, and should pyinfra or CPython change, it silently stops helping and nothing breaks.
``install_for(state)`` is called explicitly by the preflight's steps (which every deploy runs
first) for the directory of the deploy file pyinfra runs, never on import. Idempotent.

Checked against pyinfra 3.10.0 (``api/util.py`` ``get_operation_order_from_stack``, called from
``api/operation.py`` when ``pyinfra.is_cli``) and CPython 3.11 (``inspect.getmodule``'s
``modulesbyfile`` cache).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyinfra.api import State

PREFIX = "p40fleet.runtime.deploy_frames."


def module_name(path: Path) -> str:
    """The ``sys.modules`` key standing for one deploy file."""
    return PREFIX + path.stem


def install(deploy_dir: Path) -> list[str]:
    """Enter every ``*.py`` in ``deploy_dir`` into ``sys.modules``; returns the names added."""
    added = []
    for path in sorted(Path(deploy_dir).resolve().glob("*.py")):
        name = module_name(path)
        if name in sys.modules:
            continue
        module = types.ModuleType(name, f"Stands for {path} in inspect's module cache.")
        module.__file__ = str(path)
        sys.modules[name] = module
        added.append(name)
    return added


def install_for(state: State) -> list[str]:
    """Entries for the deploy files beside the one this pyinfra run executes (none outside the
    CLI: an API run has no deploy file)."""
    filename = state.current_deploy_filename
    return install(Path(filename).parent) if filename else []
