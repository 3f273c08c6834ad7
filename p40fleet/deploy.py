"""Entry point: ``python -m p40fleet.deploy INVENTORY DEPLOY... [pyinfra args]``
(see p40fleet.cli.deploy)."""

from __future__ import annotations

import sys

from p40fleet.cli.deploy import main

if __name__ == "__main__":
    sys.exit(main())
