"""Every test session runs in its own lab instance (``$P40LAB_TEST_INSTANCE``, default ``test``).

Set here, before any test module imports ``p40lab``: the lab's paths, bridge, subnet, netns
names and mirror are fixed when ``p40lab.state`` is imported (see its docstring). So the tests
never see or touch the default lab, the one ``make demo`` leaves up for the user.
"""

from __future__ import annotations

import os

TEST_INSTANCE = os.environ.get("P40LAB_TEST_INSTANCE", "test")
if not TEST_INSTANCE:
    raise RuntimeError("P40LAB_TEST_INSTANCE is empty: the tests never use the default lab")
os.environ["P40LAB_INSTANCE"] = TEST_INSTANCE
