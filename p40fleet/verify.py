"""Entry point: ``python -m p40fleet.verify INVENTORY ...`` (see p40fleet.verify_cli)."""

from __future__ import annotations

import sys

from p40fleet.verify_cli import main

if __name__ == "__main__":
    sys.exit(main())
