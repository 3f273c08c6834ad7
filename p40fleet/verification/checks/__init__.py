"""The checks, one module per component, named as its ``facts/`` and ``operations/`` modules are
(``tests/test_component_names.py``); ``_common`` holds what several share. ``run`` orders the
probe's checks; ``ray`` is run by ``operations/run/ray_cluster.py``."""
