"""Every test session runs in its own lab instance (``$P40LAB_TEST_INSTANCE``, default ``test``).

Set here, before any test module imports ``p40lab``: the lab's paths, bridge, subnet, netns
names and mirror are fixed when ``p40lab.state`` is imported (see its docstring). So the tests
never see or touch the default lab, the one ``make demo`` leaves up for the user.
"""

from __future__ import annotations

import os
import sys

import pytest

TEST_INSTANCE = os.environ.get("P40LAB_TEST_INSTANCE", "test")
if not TEST_INSTANCE:
    raise RuntimeError("P40LAB_TEST_INSTANCE is empty: the tests never use the default lab")
os.environ["P40LAB_INSTANCE"] = TEST_INSTANCE


@pytest.fixture(autouse=True)
def _root_stands_in_for_the_training_user(request, monkeypatch):
    """Unit tests run as root (this machine, CI) use root itself (``getpass.getuser()``) as
    the training user of the commands they run. ``p40fleet_as`` refuses a uid-0 user
    (``privdrop.ROOT_GUARD``, security N13), so outside ``tests/lab`` those tests get the
    function without that guard; the lab's training user is verl, and tests marked
    ``uid0_guard`` (the guard's own) keep it."""
    if (
        os.geteuid() != 0
        or "lab" in request.path.parts
        or request.node.get_closest_marker("uid0_guard")
    ):
        yield
        return
    from p40fleet import privdrop

    guarded = privdrop.AS_USER_FN
    relaxed = guarded.replace(privdrop.ROOT_GUARD, "")
    for module in list(sys.modules.values()):
        if getattr(module, "AS_USER_FN", None) is guarded:
            monkeypatch.setattr(module, "AS_USER_FN", relaxed)
    yield
