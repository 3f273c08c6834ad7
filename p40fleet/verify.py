"""Entry point: ``python -m p40fleet.verify INVENTORY ...`` (see p40fleet.cli.verify)."""

from __future__ import annotations

import sys

from p40fleet.cli.verify import main

if __name__ == "__main__":
    sys.exit(main())
