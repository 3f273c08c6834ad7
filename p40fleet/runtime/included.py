"""Run a layer's steps under the name pyinfra's ``local.include`` gives an included file.

Adapts pyinfra's operation names. ``local.include("deploy/system.py")`` executes the file inside
``host.deploy("deploy/system.py", None, data, in_deploy=False)``, so each operation it adds is
named ``deploy/system.py | <name>``. The deploys' steps are functions now
(``p40fleet/deploys/steps/``), called where the entry points used to include files; this context
gives their operations the names they had, so pyinfra's output, the lab's tests and an admin's
scripts that read it see no change. ``Host.deploy`` is the context behind both ``@deploy`` and
``local.include``; its docstring points callers at those two, and neither fits a function
called from a function (``@deploy`` would name it ``name | …`` with ``in_deploy`` set), hence
this module. Should pyinfra change it, the names change and nothing else does.

Checked against pyinfra 3.10.0 (``local.py`` ``include``, ``api/host.py`` ``Host.deploy``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pyinfra import host


@contextmanager
def included(path: str) -> Iterator[None]:
    """Operations added inside are named ``PATH | <name>``, as in a file ``local.include``d."""
    with host.deploy(path, None, None, in_deploy=False):
        yield
