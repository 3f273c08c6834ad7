"""Entry point: ``python -m p40fleet.rekey INVENTORY HOST [--expect SHA256:...] [--yes]``
(see p40fleet.cli.rekey)."""

from __future__ import annotations

import sys

from p40fleet.cli.rekey import main

if __name__ == "__main__":
    sys.exit(main())
