"""The command lines, one module each: ``deploy`` (check the inventory, then run pyinfra),
``verify`` (run deploy/verify.py, print the report, exit from it), ``rekey`` (a reinstalled
host's new key into known_hosts). Each is started as ``python -m p40fleet.<name>``: the
modules ``p40fleet/deploy.py``, ``verify.py`` and ``rekey.py`` are thin entry points that call
its ``main``."""
