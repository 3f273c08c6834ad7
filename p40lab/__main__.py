"""``python -m p40lab`` entry point (see :mod:`p40lab.cli`)."""

import sys

from p40lab.cli import main

sys.exit(main())
