"""A host's connector arguments (``_sudo``, ``_su_user``, ``_env``, ...) for a command that the
project runs by hand (a streamed download, the run lock, the verify probe).

Adapts pyinfra's argument handling: ``CONNECTOR_ARGUMENT_KEYS`` and ``pop_global_arguments``
live in ``pyinfra.api.arguments``, which ``pyinfra.api`` does not export (the function's
signature changed between 2.x and 3.x). A callback or a probe outside an operation does not
receive the arguments from pyinfra; without them a command under ``_sudo`` would run
unprivileged. Inside an operation they are the public ``host.current_op_global_arguments``.

Checked against pyinfra 3.10.0 (``api/arguments.py``: ``CONNECTOR_ARGUMENT_KEYS``,
``pop_global_arguments(state, host, kwargs)`` returning
``(arguments, found_keys)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments

__all__ = ["connector_arguments", "host_connector_arguments"]


def connector_arguments(arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    """The connector arguments among an operation's global ``arguments`` (None: none)."""
    if not arguments:
        return {}
    return {key: arguments[key] for key in CONNECTOR_ARGUMENT_KEYS if key in arguments}


def host_connector_arguments(target: Any) -> dict[str, Any]:
    """``target``'s connector arguments as its facts run with them (its data and the
    config: ``_sudo``, ``_sudo_password``...), outside any operation."""
    arguments, _ = pop_global_arguments(target.state, target, {})
    return connector_arguments(arguments)
